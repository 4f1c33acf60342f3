"""The non-finite guard on 2 real ranks (``trainer.nonfinite``): a NaN loss on one rank at step 3
(``faults.nan_at=1:3``) is skipped by both ranks (weights, optimizer state and schedule after step 3 bitwise
those after step 2), rolled back in the other mode (the newest checkpoint reloaded, the bad batch passed
over: the same end as skipping it, the guard having kept the bad update out), or stops the run naming the
step with nothing of it saved."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, checkpoint_values, hpctrain

RUN = [
    *FAST,
    "cluster.nproc=2",
    "trainer.max_steps=4",
    "trainer.ckpt_every=1",
    "trainer.keep_last=10",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "faults.nan_at=1:3",
]


def equal(a: dict[str, object], b: dict[str, object]) -> list[str]:
    def same(x: object, y: object) -> bool:
        return torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y

    return [k for k in a.keys() | b.keys() if k not in a or k not in b or not same(a[k], b[k])]


def test_skip_leaves_the_state_bitwise_and_rollback_ends_alike(tmp_path: Path) -> None:
    skip, back = tmp_path / "skip", tmp_path / "rollback"
    result = hpctrain(*RUN, f"hydra.run.dir={skip}")
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = checkpoint_values(skip, 2), checkpoint_values(skip, 3)
    assert any(k.startswith("scheduler") for k in before) and not equal(before, after)
    records = [json.loads(line) for line in (skip / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("nonfinite")] == [3]
    assert equal(checkpoint_values(skip, 3), checkpoint_values(skip, 4)), "step 4 trains again"
    log = (skip / "logs" / "rank0.log").read_text()
    assert "Non-finite step 3" in log and "skipped" in log
    result = hpctrain(*RUN, "trainer.nonfinite=rollback", f"hydra.run.dir={back}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rolling back to the newest checkpoint" in (back / "logs" / "rank0.log").read_text()
    assert not equal(checkpoint_values(skip, 4), checkpoint_values(back, 4))
    steps = [json.loads(line)["step"] for line in (back / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], "every step logged once across the rollback"


def test_stop_ends_naming_the_step_and_saves_nothing_of_it(tmp_path: Path) -> None:
    run = tmp_path / "stop"
    result = hpctrain(*RUN, "trainer.nonfinite=stop", "cluster.max_restarts=2", f"hydra.run.dir={run}")
    assert result.returncode != 0
    assert "non-finite step 3" in result.stderr and "trainer.nonfinite=stop" in result.stderr, result.stderr
    assert [p.name for p in layout.committed(run / "checkpoints")] == ["step_00000002", "step_00000001"]
    assert not RunDir(run).read_answers(), "a non-finite stop is not restarted"


def test_a_bad_nonfinite_mode_is_refused_in_one_line(tmp_path: Path) -> None:
    result = hpctrain(*RUN, "trainer.nonfinite=maybe", f"hydra.run.dir={tmp_path / 'bad'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "trainer.nonfinite" in lines[0], result.stderr
    assert "skip, rollback, stop" in lines[0]
