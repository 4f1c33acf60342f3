"""trainer.eval_job's pins (issue 41, item 5): the pruner keeps a checkpoint whose evaluation job has not read
it yet, whatever keep_last says, and releases (with the reason) a pin whose job ended without reading it. One
process, no Slurm: the job states are what the test says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import TrainState
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.slurm import watch
from hpctrain.slurm.commands import JobState


def _steps(root: Path) -> list[int]:
    return sorted(layout.step_of(c) for c in layout.committed(root))


def test_a_pinned_checkpoint_outlives_keep_last_until_its_job_has_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunDir(tmp_path)
    states = {"101": "PENDING", "102": "PENDING"}
    asked: list[list[str]] = []

    def job_states(ids: list[str]) -> dict[str, JobState]:
        asked.append(ids)
        return {j: JobState(j, states[j], "", "", "") for j in ids if j in states}

    monkeypatch.setattr(watch, "watched_states", job_states)
    manager = CheckpointManager(run.checkpoints, keep_last=1, rank=0)
    manager.on_commit = lambda step: run.write_eval_pin(step, f"10{step}")  # as EvalJobs does
    for step in (1, 2):
        manager.save(step, {"train": TrainState(step=step), "w": torch.full((2,), float(step))})
    manager.on_commit = None
    manager.save(3, {"train": TrainState(step=3), "w": torch.zeros(2)})
    assert _steps(run.checkpoints) == [1, 2, 3]  # both evaluations wait in the queue: nothing of theirs goes

    # Job 101 read its checkpoint (hpctrain eval released the pin); job 102 was cancelled before it started.
    run.write_eval_pin(1, "101", released="read")
    states["102"] = "CANCELLED"
    manager.save(4, {"train": TrainState(step=4), "w": torch.zeros(2)})
    manager.close()
    assert _steps(run.checkpoints) == [4]
    pin = run.read_eval_pins()[2]
    assert pin["released"] == "job 102 ended CANCELLED before reading it", pin
    assert asked and all("101" not in ids for ids in asked[-1:])  # a released pin costs no question


def test_pins_are_kept_when_slurm_cannot_be_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path)

    def down(ids: list[str]) -> dict[str, JobState]:
        raise RuntimeError("squeue failed: slurm_load_jobs error: Unable to contact slurm controller")

    monkeypatch.setattr(watch, "watched_states", down)
    manager = CheckpointManager(run.checkpoints, keep_last=1, rank=0)
    run.write_eval_pin(1, "7")
    for step in (1, 2, 3):
        manager.save(step, {"train": TrainState(step=step), "w": torch.zeros(2)})
    manager.close()
    assert _steps(run.checkpoints) == [1, 3]
    assert run.read_eval_pins()[1]["released"] is None


def test_a_pin_without_a_job_id_is_kept_for_its_grace_then_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sbatch call may still be running (kept), or the training job died inside it (released after
    SUBMIT_GRACE_S, with that reason for status)."""
    from hpctrain.checkpoint import pins

    run = RunDir(tmp_path)
    run.checkpoints.mkdir(parents=True)
    monkeypatch.setattr(watch, "watched_states", lambda ids: {})
    run.write_eval_pin(5, None)
    assert pins.pinned(run.checkpoints, [5]) == {5}
    monkeypatch.setattr(pins, "SUBMIT_GRACE_S", 0.0)
    assert pins.pinned(run.checkpoints, [5]) == set()
    assert run.read_eval_pins()[5]["released"] == "never submitted (sbatch hung)"
