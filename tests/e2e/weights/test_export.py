"""Issue 16: weights in and out. ``model.init_from`` starts a run from weights (an export, a checkpoint, a
state dict, a transformers folder), ``hpctrain export`` writes one model from a checkpoint saved under any
layout, ``hpctrain generate`` samples from it; bad inputs are one line."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hpctrain.cli import main
from tests.support import CLI, hpctrain, metrics
from tests.support.user_project import SHORT, user

GPT = ["data.max_bytes=100000", "logger=jsonl", "trainer.eval_batches=1", "trainer.log_every=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in gpt, 20 steps under fsdp on 2 processes, and its safetensors export."""
    root = tmp_path_factory.mktemp("weights")
    run = root / "run"
    result = hpctrain(
        *GPT,
        "parallel=fsdp",
        "cluster.nproc=2",
        "trainer.max_steps=20",
        "trainer.ckpt_every=10",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # in-process: no process boundary is under test here
        assert main(["export", str(run), "--to", str(root / "export")]) == 0
    assert "Exported" in printed.getvalue() and "step 20" in printed.getvalue()
    return root


def test_export_then_init_from_under_tp_is_exact(trained: Path):
    """Export → init_from under tp=2: the first loss equals one process's from the same weights (1e-6), and
    the weights are bit-identical (a learning rate of 1e-30 leaves them unchanged at step 1). Started again,
    the run continues its own checkpoint and ignores init_from."""
    export = trained / "export"
    assert (
        json.loads((export / "hpctrain.json").read_text())["model"]["_target_"] == "hpctrain.models.gpt.GPT"
    )
    one, tp = trained / "one", trained / "tp"
    same = [
        *GPT,
        f"model.init_from={export}",
        "trainer.max_steps=1",
        "optim.lr=1e-30",
        "trainer.ckpt_every=1",
    ]
    assert hpctrain(*same, "parallel=none", "cluster.nproc=1", f"hydra.run.dir={one}").returncode == 0
    result = hpctrain(*same, "parallel=tp", "cluster.nproc=2", f"hydra.run.dir={tp}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Initialised the model from {export}" in result.stderr + result.stdout
    first, reference = metrics(tp)[0]["loss"], metrics(one)[0]["loss"]
    assert abs(first - reference) <= 1e-6 * abs(reference), (first, reference)
    assert main(["export", str(tp), "--to", str(trained / "again")]) == 0  # in-process: torch is imported
    before, after = (
        load_file(export / "model.safetensors"),
        load_file(trained / "again" / "model.safetensors"),
    )
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    # The same command again, as a requeued job runs it: the run continues its own checkpoint (step 1), not
    # the initial weights (that a resume is exact is tests/e2e/checkpoint/test_resume.py's).
    more = [a for a in same if a != "trainer.max_steps=1"] + ["trainer.max_steps=2"]
    again = hpctrain(*more, "parallel=tp", "cluster.nproc=2", f"hydra.run.dir={tp}")
    output = again.stderr + again.stdout
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ignored: continuing the checkpoint" in output and "Initialised the model" not in output
    assert "(step 1)" in output and [r["step"] for r in metrics(tp)] == [1, 2]


def test_generate_is_deterministic_with_a_seed(trained: Path, capsys: pytest.CaptureFixture[str]):
    args = ["generate", str(trained / "run"), "--prompt", "def ", "--max-new-tokens", "24", "--seed", "3"]
    first = hpctrain(*args)  # as typed; the repeats run in-process (the same code, without importing torch)
    assert first.returncode == 0, first.stderr
    capsys.readouterr()
    assert main(args) == 0
    second = capsys.readouterr().out
    assert first.stdout == second and first.stdout.startswith("def ") and len(first.stdout) > 8
    assert main(["generate", str(trained / "export"), *args[2:]]) == 0
    assert capsys.readouterr().out == first.stdout


def test_transformers_model_exports_a_folder_from_pretrained_loads(
    in_project: Path, tmp_path: Path, cli: CLI
):
    from transformers import AutoModelForCausalLM

    from hpctrain.weights.generate import load_model

    project = in_project  # its package importable here too: load_model builds the user's model
    run, folder = tmp_path / "run", tmp_path / "hf"
    result = user(
        project,
        "model=gpt2_tiny",
        "data=bytes",
        "data.max_bytes=60000",
        *SHORT,
        "trainer.max_steps=3",
        "cluster.nproc=2",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    exported = cli("export", str(run), "--to", str(folder), "--format", "hf", cwd=project)  # in-process
    assert exported.returncode == 0, exported.stderr
    theirs = AutoModelForCausalLM.from_pretrained(folder)
    ours, _, _ = load_model(run, None)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (theirs(x).logits - ours(x).logits).abs().max().item()
    assert gap <= 1e-5, gap


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), lines
    assert words in lines[0], lines


def test_init_from_a_state_dict_with_a_renamed_key_is_one_line(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    weights = load_file(trained / "export" / "model.safetensors")
    weights["layers.0.attn.query.weight"] = weights.pop("layers.0.attn.q.weight")
    renamed = tmp_path / "renamed.pt"
    torch.save(weights, renamed)
    save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    (tmp_path / "code.pt").write_bytes(b"\x80\x04cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.")
    base = ["trainer.max_steps=1", "parallel=none", "cluster.nproc=1", f"hydra.run.dir={tmp_path / 'r'}"]
    for value, words in [
        (renamed, "1 missing (layers.0.attn.q.weight); 1 unexpected (layers.0.attn.query.weight)"),
        (tmp_path / "other.safetensors", "does not fit the model"),
        (tmp_path / "code.pt", "cannot be read as weights"),
    ]:
        from hpctrain.config.compose import compose, to_typed
        from hpctrain.errors import ConfigError
        from hpctrain.models import build_model
        from hpctrain.weights.load import load_into

        model = build_model(to_typed(compose([])).model)
        with pytest.raises(ConfigError, match=r"^model\.init_from=") as caught:
            load_into(model, value)
        assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    _one_line(
        capsys, ["model.init_from=/nonexistent/w.pt", *base], "model.init_from=/nonexistent/w.pt: no such"
    )
    _one_line(capsys, ["model.init_from=''", *base], "model.init_from=: empty")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--format", "onnx"], "--format=onnx: not a known format"),
        (["--dtype", "int8"], "--dtype=int8: not a known dtype"),
        (["--step", "7"], "--step=7: no committed checkpoint of that step (valid: 20, 10)"),
        (["--format", "hf"], "--format=hf: model hpctrain.models.gpt.GPT is not a transformers model"),
        (["--max-shard-gb", "0"], "--max-shard-gb=0.0: must be > 0"),
    ],
)
def test_bad_export_inputs_are_one_line(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
):
    _one_line(capsys, ["export", str(trained / "run"), "--to", str(tmp_path / "x"), *argv], words)
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.partial-*"))


def test_bad_export_and_generate_targets_are_one_line(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    _one_line(capsys, ["export", str(tmp_path), "--to", str(tmp_path / "x")], "not a run directory")
    _one_line(
        capsys, ["export", str(trained / "run"), "--to", str(full)], "exists and is not an empty folder"
    )
    assert (full / "keep.txt").read_text() == "mine"
    _one_line(capsys, ["export", str(trained / "run"), "--to", "a\x1bb"], "control character")
    _one_line(capsys, ["generate", str(tmp_path / "none"), "--prompt", "x"], "no such file or directory")
    _one_line(capsys, ["generate", str(trained / "run"), "--prompt", ""], "--prompt=: empty")
    _one_line(
        capsys, ["generate", str(trained / "run"), "--prompt", "x", "--temperature", "-1"], "must be ≥ 0"
    )
    other = tmp_path / "other"
    other.mkdir()
    (other / "hpctrain.json").write_text(json.dumps({"format": "hpctrain-export", "version": 9}))
    _one_line(capsys, ["generate", str(other), "--prompt", "x"], "not an hpctrain export of version 1")
