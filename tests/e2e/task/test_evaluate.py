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
        *FAST, "cluster.nproc=2", "trainer.max_steps=20", "trainer.ckpt_every=10", "trainer.eval_every=10",
        "trainer.log_every=10", "trainer.eval_batches=2", f"hydra.run.dir={run}",
    )  # fmt: skip
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
