"""Issue 41, the smaller items: each bad input is one line naming the key, the value and what is valid, with
exit status 2, no traceback, and nothing written. In-process through the CLI's entry point; nothing here
starts a worker or a job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.rundir import SWEEP_RECORD
from hpctrain.rundir.lock import LOCK_FILE, RunLock
from hpctrain.rundir.records import SweepMember, SweepRecord, write_json
from tests.support.cli import refused

FAST = ["data.max_bytes=100000", "trainer.max_steps=2", "logger=jsonl"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["trian"], "unknown command 'trian' (did you mean train?)"),
        (["sumary", "multirun/x"], "unknown command 'sumary' (did you mean summary?)"),
        (["xyzzy"], "unknown command 'xyzzy' (valid: train, resume"),
    ],
    ids=["trian", "sumary", "no-close-match"],
)
def test_a_mistyped_subcommand_is_named_as_one(here: Path, capsys, argv: list[str], words: str):
    refused(capsys, argv, words)
    assert list(here.iterdir()) == []


def test_prepare_of_a_missing_input_is_a_bad_input(here: Path, capsys):
    refused(capsys, ["prepare", str(here / "nonexistent"), "--out", str(here / "x.bin")], "does not exist")
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (
            ["optim.lr=1e-3,3e-4", "run=lrs"],
            "run its -m command again: hpctrain -m optim.lr=1e-3,3e-4 run=lrs",
        ),
        (["train", "optim.lr=1e-3,3e-4"], "run its -m command again: hpctrain train -m optim.lr=1e-3,3e-4"),
        (None, "run its -m command again: the -m command that started it"),
    ],
    ids=["recorded", "typed-train", "older-record"],
)
def test_resume_of_a_sweep_names_its_command(here: Path, capsys, command: list[str] | None, words: str):
    sweep = here / "multirun" / "lrs"
    members = [
        SweepMember(i, [f"optim.lr={lr}"], str(sweep / str(i)), "local") for i, lr in enumerate((1, 2))
    ]
    sweep.mkdir(parents=True)
    write_json(sweep / SWEEP_RECORD, SweepRecord("local", "local", members, command=command))
    before = sorted(here.rglob("*"))
    line = refused(capsys, ["resume", str(sweep)], f"RUN_DIR={sweep}: is a sweep (2 members): {words}")
    assert f"valid: that command, or one member's run directory, e.g. {sweep / '0'}" in line
    assert sorted(here.rglob("*")) == before


def test_a_locked_run_directory_names_the_run_name_typed(here: Path, capsys):
    run_dir = here / "outputs" / "mine"
    with RunLock(run_dir).acquire(job_id="4242"):  # another open file description: flock refuses the run
        line = refused(capsys, ["run=mine", *FAST, "dry_run=true"], "run=mine: its directory outputs/mine: ")
    assert "another run is using this directory" in line and "hydra.run.dir" not in line, line
    assert "(valid: another run= name, or wait for that run to end)" in line, line
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written beside the lock


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("optim.lr=1e-3,3e-4", "optim.lr=1e-3,3e-4: is a sweep, and the command has no -m (valid: add -m"),
        ("optim.lr=range(1,3)", "optim.lr=range(1,3): is a sweep, and the command has no -m (valid: add -m"),
    ],
    ids=["comma-list", "range"],
)
def test_a_sweep_without_m_keeps_hydras_hint(here: Path, capsys, override: str, words: str):
    refused(capsys, [override, *FAST, "dry_run=true"], words)
    assert list(here.iterdir()) == []


OPTUNA_LINE = (
    "(valid: hydra/sweeper=optuna (pip install 'hpctrain[sweep]'), or a list of values: optim.lr=A,B,C)"
)


@pytest.mark.parametrize(
    "sweep",
    [
        ["optim.lr=interval(1e-4,1e-2)"],
        ["hydra.sweeper.params={optim.lr:interval(1e-4,1e-2)}"],
        ["+hydra.sweeper.params.optim.lr=interval(1e-4,1e-2)"],
    ],
    ids=["override", "params-mapping", "params-key"],
)
def test_an_interval_under_the_basic_sweeper_names_optuna(here: Path, capsys, sweep: list[str]):
    line = refused(capsys, ["-m", *sweep, *FAST], "optim.lr=interval(1e-4,1e-2): an interval needs a sweeper")
    assert line.endswith(OPTUNA_LINE), line
    assert list(here.iterdir()) == []  # Hydra's basic sweeper made the sweep directory before its traceback


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["model.n_layers=1000000000000"],
            "model.n_layers=1000000000000: deeper than any model the planner plans",
        ),
        (
            ["model=gpt2_124m", "model.n_layers=1000000000000"],
            "parameters (model.d_model=768) fit on no machine",
        ),
    ],
    ids=["deep", "huge"],
)
@pytest.mark.timeout(60)  # a hang guard, not a timing: it answers in about a second
def test_a_model_that_fits_nowhere_is_refused_before_its_sheet_is_built(here: Path, capsys, argv, words: str):
    """Issue 41: the planner listed every layer's tensors first: no answer within 120 s."""
    refused(capsys, [*argv, *FAST, "dry_run=true"], words)
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["faults.fail_at=5:2"],
            "faults.fail_at=5:2: rank 5 is not in this run of 2 rank(s) (valid: a rank from 0 to 1)",
        ),
        (
            ["faults.kill_at=2:1@1", "cluster.nproc=2"],
            "faults.kill_at=2:1@1: rank 2 is not in this run of 2 rank(s)",
        ),
        (
            ["data.num_workers=100000"],
            "data.num_workers=100000: more loader processes per rank than 4 × this",
        ),
        (["data=text", "data.path=corpus.txt"], "data.path=corpus.txt: data=text reads no file"),
        (
            ["faults.stop_at=1:2", "faults.stop_in=compute"],
            "faults.stop_in=compute: not a point where a rank stops (valid: step, report)",
        ),
        (["faults.stop_in="], "faults.stop_in"),
        (["faults.stop_in=rep\x01ort"], "faults.stop_in"),
        (["faults.oom_at=1"], "faults.oom_at=1: expected RANK:STEP"),
        (["faults.oom_at="], "faults.oom_at"),
        (["faults.oom_at=1:\x013"], "faults.oom_at"),
        (["faults.oom_at=4:3"], "faults.oom_at=4:3: rank 4 is not in this run of 2 rank(s)"),
    ],
    ids=[
        "fail_at",
        "kill_at",
        "num_workers",
        "path-of-text",
        "stop_in",
        "stop_in-empty",
        "stop_in-ctrl",
        "oom_at",
        "oom_at-empty",
        "oom_at-ctrl",
        "oom_at-rank",
    ],
)
def test_a_rank_or_a_resource_the_run_does_not_have_is_refused(
    here: Path, capsys, argv: list[str], words: str
):
    refused(capsys, [*argv, *FAST, "dry_run=true"], words)
    assert list(here.iterdir()) == []


def test_parallel_none_is_one_process_unless_nproc_is_typed(here: Path, capsys):
    """Issue 41: docs/parallelism.md's table says one process; the local default of 2 refused it."""
    assert main(["parallel=none", *FAST, "dry_run=true"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["plan", "parallel=none"]) == 0
    assert "local: 1 process on this machine" in capsys.readouterr().out
    refused(
        capsys, ["parallel=none", "cluster.nproc=2", *FAST, "dry_run=true"], "cluster.nproc=2: parallel=none"
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["export"], "hpctrain export: the following arguments are required: RUN_DIR, --to"),
        (["export", "run", "--to", "out", "--bogus"], "hpctrain export: unrecognized arguments: --bogus"),
        (["generate"], "hpctrain generate: the following arguments are required: SOURCE, --prompt"),
        (["generate", "run", "--prompt", "hi", "--top-k", "x"], "--top-k: invalid int value: 'x'"),
        (["plan", "--bogus"], "hpctrain plan: unrecognized arguments: --bogus"),
        (["plan", "--top", ""], "hpctrain plan: argument --top: invalid int value: ''"),
        (["eval", "run", "--step", "\x01"], "hpctrain eval: argument --step: invalid int value"),
    ],
    ids=["export", "export-flag", "generate", "generate-int", "plan-flag", "plan-empty", "eval-ctrl"],
)
def test_a_subcommands_bad_arguments_are_one_line_not_argparses_usage(
    here: Path, capsys, argv: list[str], words: str
):
    """Issue 41 (b, untidy refusals): export, generate and plan printed argparse's multi-line usage."""
    assert words in refused(capsys, argv, words)
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["loss=model"], "loss=model: model hpctrain.models.gpt.GPT does not compute its own loss"),
        (["optim.eps=-1"], "optim.eps=-1.0: must be > 0"),
        (["optim.eps=0"], "optim.eps=0.0: must be > 0"),
        (["optim=sgd", "optim.momentum=-1"], "optim.momentum=-1.0: must be in [0, 1)"),
        (["optim=sgd", "optim.momentum=1"], "optim.momentum=1.0: must be in [0, 1)"),
        (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], "optim.nesterov=True: Nesterov momentum"),
        (["trainer.seed=-1"], "trainer.seed=-1: out of range (valid: 0 to 4294967295"),
        (["trainer.seed=4294967296"], "trainer.seed=4294967296: out of range"),
        (["logger=[console,nosuch]"], "logger=nosuch: unknown option (valid: console, jsonl, tensorboard"),
    ],
    ids=["loss-model", "eps", "eps-0", "momentum", "momentum-1", "nesterov", "seed", "seed-2^32", "logger"],
)
def test_a_bad_value_names_its_own_key(here: Path, capsys, argv: list[str], words: str):
    """Issue 41 (b, untidy refusals): each named the wrong key (data=text for loss=model), no key at all
    (logger: "unknown config"), or was accepted until torch refused it on every rank."""
    refused(capsys, [*FAST, *argv, "dry_run=true"], words)  # argv last: FAST's logger=jsonl is overridden
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "_target_: torch.nn.Linear\nin_features: [1\n",
            "expected ',' or ']', but got '<stream end>' (line 3",
        ),
        ("a: b: c\n", "mapping values are not allowed here (line 1, column 5)"),
        ("\t- x\n", "found character '\\t' that cannot start any token"),
    ],
    ids=["flow", "mapping", "tab"],
)
def test_a_broken_user_yaml_names_its_file_and_line(here: Path, capsys, text: str, problem: str):
    (here / "conf" / "model").mkdir(parents=True)
    (here / "conf" / "model" / "mine.yaml").write_text(text)
    line = refused(capsys, ["--config-dir", "conf", "model=mine", *FAST, "dry_run=true"], problem)
    assert line.startswith(f"hpctrain: model=mine: {here / 'conf/model/mine.yaml'} is not valid YAML: "), line
    assert sorted(p.name for p in here.iterdir()) == ["conf"]


@pytest.mark.parametrize(
    "value", ["abc", "", "-1", "1\n2", "٣"], ids=["word", "empty", "negative", "ctrl", "digit"]
)
def test_a_slurm_count_in_the_shell_that_is_no_count_is_refused_before_a_run_dir(
    here: Path, capsys, monkeypatch: pytest.MonkeyPatch, value: str
):
    """Issue 41 (b): SLURM_RESTART_COUNT=abc failed every rank with int()'s ValueError, left a run dir."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", value)
    shown = value.replace("\n", "\\n")  # a control character is shown escaped
    refused(capsys, FAST, f"SLURM_RESTART_COUNT={shown}: in this shell's environment, and not a count")
    assert list(here.iterdir()) == []


USER_CODE = """import torch
from torch import nn


def int_loss(outputs, batch):
    return torch.tensor(3)


def constant_loss(outputs, batch):
    return torch.tensor(3.0)


class NoParameters(nn.Module):
    def forward(self, x):
        return torch.zeros(x.shape[0], 10, device=x.device) + x.flatten(1)[:, :1]
"""


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["loss=mine"],
            "loss._target_=issue41_user.int_loss: returned a torch.int64 tensor, which has no gradient",
        ),
        (["loss=mine", "loss._target_=issue41_user.constant_loss"], "does not depend on the model's output"),
        (
            ["model=mine", "data=digits"],
            "model._target_=issue41_user.NoParameters: has no trainable parameters",
        ),
    ],
    ids=["int-loss", "constant-loss", "no-parameters"],
)
def test_a_user_loss_or_model_that_cannot_train_is_refused_before_a_run_dir(
    here: Path, capsys, monkeypatch: pytest.MonkeyPatch, argv: list[str], words: str
):
    """Issue 41 (b): each failed on every rank (backward() of an int tensor, an empty parameter list) and
    left an empty run directory behind."""
    (here / "issue41_user.py").write_text(USER_CODE)
    for group, target in (("loss", "issue41_user.int_loss"), ("model", "issue41_user.NoParameters")):
        (here / "conf" / group).mkdir(parents=True)
        (here / "conf" / group / "mine.yaml").write_text(f"_target_: {target}\n")
    monkeypatch.syspath_prepend(str(here))
    monkeypatch.delitem(sys.modules, "issue41_user", raising=False)
    refused(capsys, ["--config-dir", "conf", *FAST, *argv], words)
    assert sorted(p.name for p in here.iterdir() if p.name != "__pycache__") == ["conf", "issue41_user.py"]


def test_a_token_file_shorter_than_one_window_is_refused_before_a_run_dir(here: Path, capsys):
    """Issue 41 (b): a token file too small for one sample failed every rank and left a run directory."""
    (here / "tiny.txt").write_text("just a few bytes\n")  # 17 tokens: no window of the GPT's 64
    assert main(["prepare", str(here / "tiny.txt"), "--out", str(here / "tiny.bin")]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in here.iterdir())
    words = f"data.path={here / 'tiny.bin'}: holds 17 tokens: fewer than 2 windows of 64 + 1"
    refused(capsys, [*FAST, "data=tokens", f"data.path={here / 'tiny.bin'}"], words)
    assert sorted(p.name for p in here.iterdir()) == before
