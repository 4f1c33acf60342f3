"""Issue 29, item 1: what a new user gets wrong in their first hour is refused before anything starts, in
one line (the user's own frames above it when their code raised), with exit status ≠ 0, and leaves no run
directory behind. In-process through the CLI's entry point; nothing here starts a worker or a job."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.cli import main
from tests.support.cli import refused

# The Slurm commands a new user types first: the README's headline (gpt2, sweep) and docs/plan.md's 3d layout.
README_SLURM = [
    ["model=vit", "parallel=3d", "cluster=a100x32"],
    ["model=gpt2_124m", "cluster=a100x32"],
    ["-m", "optim.lr=1e-3,3e-4", "trainer.seed=1,2", "cluster=a100x32"],
]
FAST = ["data.max_bytes=100000", "trainer.max_steps=2", "logger=jsonl"]


def _user_frames_then_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], frame: str, words: str):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0] == "Traceback of your code (most recent call last):", err
    assert frame in err, err
    assert "/hpctrain/" not in err.replace(lines[-1], ""), err  # none of hpctrain's own frames
    assert lines[-1].startswith("hpctrain: ") and words in lines[-1], err


@pytest.mark.skipif(Path("/etc/slurm/slurm.conf").is_file(), reason="this machine has a Slurm configuration")
@pytest.mark.parametrize("argv", README_SLURM, ids=["3d", "gpt2", "sweep"])
def test_readme_slurm_commands_without_slurm_are_one_line_and_leave_nothing(
    here: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
):
    refused(capsys, argv, "cannot submit from here")
    assert list(here.iterdir()) == []  # no outputs/, no multirun/


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="no sbatch on PATH")
def test_a_job_sbatch_refuses_is_one_line_and_leaves_nothing(
    here: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    conf = here.parent / "slurm.conf"
    conf.write_text("")  # sbatch: "Unable to process configuration file"
    monkeypatch.setenv("SLURM_CONF", str(conf))
    # capfd: Hydra's run configures logging onto the real stdout, which capsys replaces
    argv = ["model=gpt2_124m", "cluster=a100x32", "cluster.example=false", "plan_check=false"]
    refused(capfd, argv, "sbatch refused the job", 1)
    assert list(here.iterdir()) == []


def _project(root: Path, name: str, getitem: str, extra: str = "") -> Path:
    """A user's package ``name`` with a 10-class dataset whose ``__getitem__`` body is ``getitem``."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(
        textwrap.dedent(
            f"""
            import torch

            class Blobs(torch.utils.data.Dataset):
                def __init__(self, split, n=64):
                    self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
                    self.y = torch.arange(n) % 10

                def __len__(self):
                    return len(self.y)

                def __getitem__(self, i):
            {textwrap.indent(getitem, " " * 8)}
            """
        )
        + "\n"
        + extra
        + "\n"
    )
    (package / "net.py").write_text(
        "import torch\n\ndef mlp(width=8, num_classes=10):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, num_classes))\n"
    )
    return package


@pytest.fixture
def project(here: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """Write a user project into the current folder: a package (named after the test: modules are cached
    by name) and conf/model/mlp.yaml, conf/data/blobs.yaml naming it. Returns the command's arguments."""
    monkeypatch.syspath_prepend(str(here))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def make(getitem: str, extra: str = "") -> list[str]:
        digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
        name = "proj_" + "".join(
            chr(ord("a") + int(c, 16)) for c in digest
        )  # letters: Hydra reads 4e7 as a number
        _project(here, name, getitem, extra)
        for group, text in (
            ("model", f"_target_: {name}.net.mlp\nwidth: 8\nnum_classes: 10\n"),
            ("data", f"_target_: {name}.data.Blobs\n"),
        ):
            (here / "conf" / group).mkdir(parents=True, exist_ok=True)
            (here / "conf" / group / f"{'mlp' if group == 'model' else 'blobs'}.yaml").write_text(text)
        make.package = name  # type: ignore[attr-defined]
        return ["--config-dir", "conf", "model=mlp", "data=blobs", "parallel=none", "cluster.nproc=1", *FAST]

    return make


def test_a_typo_in_the_users_getitem_shows_their_frames_then_one_line(project, capsys, here: Path):
    argv = project("return self.xx[i], self.y[i]")
    _user_frames_then_one_line(capsys, argv, "return self.xx[i], self.y[i]", "raised AttributeError")
    assert not (here / "outputs").exists()


def test_a_collate_that_raises_shows_its_frames_then_one_line(project, capsys):
    argv = project(
        "return self.x[i], self.y[i]", "def collate(items):\n    raise ValueError('my collate broke')"
    )
    argv.append(f"+data.collate._target_={project.package}.data.collate")
    _user_frames_then_one_line(capsys, argv, "raise ValueError('my collate broke')", "my collate broke")


def test_ragged_items_are_one_line_naming_the_collate(project, capsys):
    argv = project("return self.x[i][: 1 + i % 3], self.y[i]")
    refused(capsys, argv, "cannot be collated into a batch")


@pytest.mark.parametrize(
    ("body", "words"),
    [("import no_such_module_anywhere\n", "ModuleNotFoundError"), ("def broken(:\n", "SyntaxError")],
)
def test_a_user_module_that_fails_to_import_shows_its_frames_then_one_line(
    project, capsys, here: Path, body: str, words: str
):
    argv = project("return self.x[i], self.y[i]")
    (here / project.package / "broken.py").write_text(body)
    argv.append(f"model._target_={project.package}.broken.Net")
    _user_frames_then_one_line(capsys, argv, "broken.py", words)


def test_labels_out_of_the_models_range_are_found_before_start(project, capsys, here: Path):
    argv = [*project("return self.x[i], self.y[i]"), "model.num_classes=5"]
    line = refused(capsys, argv, "outside model")
    assert "5 outputs" in line and "label 9" in line
    assert not (here / "outputs").exists()


def test_a_missing_optional_package_is_named_with_its_pip_line_before_start(here, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    line = refused(capsys, [*FAST, "logger=tensorboard"], "needs the package 'tensorboard'")
    assert "pip install 'hpctrain[tensorboard]'" in line
    assert not (here / "outputs").exists()


def test_init_from_of_another_shape_is_found_before_start(here, capsys):
    import torch
    from safetensors.torch import save_file

    from hpctrain.models.gpt import GPT

    save_file(
        {
            k: v.contiguous()
            for k, v in GPT(n_layers=1, d_model=32, n_heads=2).state_dict().items()
            if k != "head.weight"
        },
        str(here.parent / "w.safetensors"),
    )
    del torch
    line = refused(
        capsys, [f"model.init_from={here.parent / 'w.safetensors'}", *FAST], "does not fit the model"
    )
    assert "of another shape" in line
    assert not (here / "outputs").exists()


def test_an_example_profile_is_not_submitted_with_its_placeholders(here, capfd, monkeypatch):
    conf = here.parent / "slurm.conf"
    conf.write_text("")  # a Slurm "configuration" here: the example check is what refuses
    monkeypatch.setenv("SLURM_CONF", str(conf))
    line = refused(capfd, ["model=gpt2_124m", "cluster=a100x32"], "is an example profile")
    assert "partition (gpu)" in line and "account (unset)" in line and "example: false" in line
    assert list(here.iterdir()) == []


def test_a_dataset_smaller_than_one_global_batch_isrefused(project, capsys):
    argv = [*project("return self.x[i], self.y[i]"), "data.n=8"]
    line = refused(capsys, argv, "its train split has 8 items, fewer than one global batch of 16")
    assert "data._target_=" in line


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("optim.lr=1e30", "optim.lr=1e+30: must be > 0 and at most 10"),
        ("cluster.kill_grace_s=-1", "cluster.kill_grace_s=-1.0: must be ≥ 0"),
        ("hydra.run.dir=${oc.env:HPCTRAIN_NO_SUCH_VARIABLE}", "cannot be resolved"),
        ("hydra.run.dir=", "empty"),
        ("cluster.master_addr=10.255.255.1", "not an address of this machine"),
    ],
)
def test_run_directory_and_rendezvous_mistakes_are_one_line(here, capsys, override: str, words: str):
    refused(capsys, [override, *FAST], words)
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    ("sweep", "words"),
    [
        ("optim.lr=range(1,0)", "sweeps over no value"),
        ("optim.lr=range(0,1,0)", "not a valid sweep"),
        ("trainer.seed=range(0,100000000)", "more than 10000 runs"),
    ],
)
def test_malformed_sweep_ranges_are_one_line(here, capsys, sweep: str, words: str):
    refused(capsys, ["-m", sweep, "dry_run=true"], words)


# ---------------------------------------------------------------------------------------------- records


def _fake_run(root: Path, config: str) -> Path:
    run = root / "run"
    (run / "checkpoints" / "step_00000001").mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    return run


LOSS = "loss:\n  _target_: hpctrain.train.loss.cross_entropy\n"


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ("model: [unclosed\n", "its config.yaml cannot be read"),
        ("model:\n  _target_: hpctrain.models.gpt.GPT\ntrainer:\n  max_stepz: 3\n" + LOSS, "config.yaml"),
    ],
    ids=["garbled", "unknown-key"],
)
def test_export_of_a_run_with_a_bad_config_is_one_line(tmp_path, capsys, config: str, words: str):
    run = _fake_run(tmp_path, config)
    refused(capsys, ["export", str(run), "--to", str(tmp_path / "out")], words)
    assert not (tmp_path / "out").exists()


def test_export_and_generate_build_no_callable_a_shared_folder_names(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    config = f"model:\n  _target_: builtins.open\n  file: {victim}\n  mode: w\ndata:\n  name: text\n{LOSS}"
    run = _fake_run(tmp_path, config)
    refused(capsys, ["export", str(run), "--to", str(tmp_path / "out")], "not a model class")
    refused(capsys, ["generate", str(run), "--prompt", "x"], "--trust-code")
    export = tmp_path / "export"
    export.mkdir()
    opener = {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    meta = {"format": "hpctrain-export", "version": 1, "model": opener}
    (export / "hpctrain.json").write_text(json.dumps(meta))
    refused(capsys, ["generate", str(export), "--prompt", "x"], "not a model class")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "hpctrain.json cannot be read"),
        ('{"format": "hpctrain-export", "version": 1}', "incomplete"),
        ('{"format": "hpctrain-export", "version": 1, "model": {"n_layers": 2}}', "incomplete"),
        ("[1, 2]", "not an hpctrain export"),
    ],
    ids=["garbled", "no-model", "no-target", "a-list"],
)
def test_generate_from_a_damaged_export_is_one_line(tmp_path, capsys, text: str, words: str):
    (tmp_path / "hpctrain.json").write_text(text)
    refused(capsys, ["generate", str(tmp_path), "--prompt", "x"], words)


def test_export_to_a_place_it_cannot_write_is_one_line(tmp_path, capsys):
    run = _fake_run(tmp_path, "model:\n  _target_: hpctrain.models.gpt.GPT\n" + LOSS)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused(capsys, ["export", str(run), "--to", str(blocker / "out")], "--to=")


# ---------------------------------------------------------------------------------------------- new keys


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("a/b", "run=a/b: not a run name"),
        ("..", "run=..: not a run name"),
        ("'a\x1bb'", "not a run name"),
        ("x" * 101, "not a run name"),
        ("''", "run=: not a run name"),
    ],
    ids=["slash", "dotdot", "control", "long", "empty"],
)
def test_a_bad_run_name_is_one_line(here, capsys, name: str, words: str):
    refused(capsys, [f"run={name}", *FAST, "dry_run=true"], words)
    assert list(here.iterdir()) == []


def test_a_run_name_and_a_run_directory_together_are_one_line(here, capsys):
    refused(capsys, ["run=x", "hydra.run.dir=y", *FAST, "dry_run=true"], "both name the run's directory")


def test_resume_of_what_is_not_a_run_is_one_line(here, capsys):
    (here / "plain").mkdir()
    (here / "afile").write_text("")
    garbled = here / "outputs" / "garbled"
    (garbled / ".hydra").mkdir(parents=True)
    (garbled / "config.yaml").write_text("trainer: {}\n")
    (garbled / ".hydra" / "overrides.yaml").write_text("[]\n")
    (garbled / ".hydra" / "hydra.yaml").write_text("{{{ not yaml")
    cases = [
        ([str(here / "nowhere")], "no such directory"),
        ([str(here / "plain")], "is not a run hpctrain started"),
        ([str(here / "afile")], "no such directory"),
        ([str(garbled)], "cannot be read"),
        ([], "hydra.yaml cannot be read"),  # the latest run is the garbled one
    ]
    for argv, words in cases:
        refused(capsys, ["resume", *argv], words)
    assert sorted(p.name for p in here.iterdir()) == ["afile", "outputs", "plain"]
