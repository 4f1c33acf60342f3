"""``hpctrain eval RUN_DIR [--step N] [OVERRIDES]``: the run's own validation of a committed checkpoint, equal
to what training logged at that step, appended to eval.jsonl and shown by status; bad inputs in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import FAST, hpctrain, metrics


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("eval") / "run"
    done = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=20",
        "trainer.ckpt_every=10",
        "trainer.eval_every=10",
        "trainer.log_every=10",
        "trainer.eval_batches=2",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr
    return run


def test_eval_of_a_step_is_the_validation_training_logged(trained: Path) -> None:
    logged = {r["step"]: r["val_loss"] for r in metrics(trained) if "val_loss" in r}
    done = hpctrain("eval", str(trained), "--step", "10")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (trained / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10]
    # 2 ranks then, 1 process now: the same samples, grouped otherwise in the sum.
    assert records[0]["val_loss"] == pytest.approx(logged[10], rel=1e-5, abs=1e-5)
    assert done.stdout.startswith("step 10: val_loss ")

    latest = hpctrain("eval", str(trained), "trainer.eval_batches=1")  # the latest checkpoint, 1 batch
    assert latest.returncode == 0, latest.stderr
    last = json.loads((trained / "eval.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 20 and last["eval_batches"] == 1

    status = hpctrain("status", str(trained))
    assert status.returncode == 0, status.stderr
    line = next(line for line in status.stdout.splitlines() if line.startswith("eval "))
    assert f"val_loss {last['val_loss']:.4f} (step 20; 2 evaluations)" in line, status.stdout


BAD = [
    (["--step", "7"], "--step=7: no committed checkpoint of that step (valid: 20, 10)"),
    (["trainer.nope=3"], "trainer.nope=3: not a key=value of the run's config"),
    (["trainer.eval_batches=abc"], "trainer.eval_batches=abc"),
    (["trainer.eval_batches"], "trainer.eval_batches=null: not a key=value"),
    (["trainer.eval_batches='4\x1b'"], "OVERRIDES=trainer.eval_batches='4\\x1b': contains the control"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_eval_arguments_are_one_line(trained: Path, args: list[str], message: str) -> None:
    before = (trained / "eval.jsonl").read_bytes() if (trained / "eval.jsonl").exists() else b""
    done = hpctrain("eval", str(trained), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpctrain: {message}"), done.stderr
    after = (trained / "eval.jsonl").read_bytes() if (trained / "eval.jsonl").exists() else b""
    assert after == before, "a refused evaluation wrote something"


def test_eval_of_what_is_not_a_run(tmp_path: Path) -> None:
    for target, message in ((tmp_path, "RUN_DIR="), (tmp_path / "a\nb", "RUN_DIR=")):
        done = hpctrain("eval", str(target))
        assert done.returncode == 2 and done.stderr.startswith(f"hpctrain: {message}"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


METRICS = """
def first_weight(model, data, device):
    weight = next(model.parameters())
    same = int(weight.device == device)
    return {"first_weight": weight.flatten()[0], "val_items": len(data), "device_ok": same}


def raises(model, data, device):
    raise RuntimeError("my metric broke")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    (folder / "mymetrics.py").write_text(METRICS)
    return folder


def test_eval_target_is_the_users_function_on_the_checkpoints_weights(trained: Path, project: Path) -> None:
    found = {}
    for step in (10, 20):
        done = hpctrain(
            "eval", str(trained), "--step", str(step), "eval._target_=mymetrics.first_weight", cwd=project
        )
        assert done.returncode == 0, done.stderr
        record = json.loads((trained / "eval.jsonl").read_text().splitlines()[-1])
        assert record["step"] == step and record["eval_target"] == "mymetrics.first_weight"
        assert record["device_ok"] == 1 and record["val_items"] > 0 and "val_loss" not in record
        assert done.stdout.startswith(f"step {step}: first_weight ")
        found[step] = record["first_weight"]
    assert found[10] != found[20]  # each checkpoint's own
    status = hpctrain("status", str(trained))
    line = next(line for line in status.stdout.splitlines() if line.startswith("eval "))
    assert "first_weight" in line and "(step 20;" in line, status.stdout


# What the function returns is checked in tests/unit/task/test_eval_target.py; here the two ways it fails
# in a process: before the checkpoint is read (an import), and after (the user's code raises).
BAD_TARGETS = [
    ("eval._target_=nosuchmodule.fn", "eval._target_=nosuchmodule.fn: cannot be imported"),
    (
        "eval._target_=mymetrics.raises",
        "eval._target_=mymetrics.raises: raised RuntimeError: my metric broke",
    ),
]


@pytest.mark.parametrize(("arg", "message"), BAD_TARGETS, ids=[a for a, _ in BAD_TARGETS])
def test_bad_eval_targets_are_one_line(trained: Path, project: Path, arg: str, message: str) -> None:
    before = (trained / "eval.jsonl").read_bytes() if (trained / "eval.jsonl").exists() else b""
    done = hpctrain("eval", str(trained), "--step", "10", arg, cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]  # the user's own traceback above it when their code raised
    assert last.startswith("hpctrain: ") and message in last, done.stderr
    assert "Traceback" not in done.stderr or "mymetrics.py" in done.stderr
    after = (trained / "eval.jsonl").read_bytes() if (trained / "eval.jsonl").exists() else b""
    assert after == before, "a refused evaluation wrote something"
