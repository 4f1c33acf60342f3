"""Issue 29, item 3: one state word per run for a run here and a Slurm job alike (RUNNING, COMPLETED,
FAILED, STOPPED, PREEMPTED; PENDING while queued), Slurm's own word kept beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.jobs.states import run_state
from hpctrain.rundir import RunDir, RunLock
from hpctrain.rundir.records import write_error_record
from hpctrain.slurm.commands import JobState


def _run(root: Path, step: int, max_steps: int = 4) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(f"trainer:\n  max_steps: {max_steps}\ntask:\n  name: train\n")
    (root / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 1.0}) + "\n")
    return root


@pytest.mark.parametrize(
    ("slurm", "step", "word"),
    [
        ("PENDING", 0, "PENDING"),
        ("REQUEUED", 2, "PENDING"),
        ("RUNNING", 2, "RUNNING"),
        ("COMPLETED", 4, "COMPLETED"),
        ("COMPLETED", 2, "STOPPED"),
        ("FAILED", 2, "FAILED"),
        ("NODE_FAIL", 2, "FAILED"),
        ("OUT_OF_MEMORY", 2, "FAILED"),
        ("CANCELLED", 2, "STOPPED"),
        ("TIMEOUT", 2, "STOPPED"),
        ("PREEMPTED", 2, "PREEMPTED"),
    ],
)
def test_slurm_states_map_onto_the_same_words(tmp_path: Path, slurm: str, step: int, word: str):
    state = run_state(_run(tmp_path / "run", step), JobState("1", slurm, "", "", ""))
    assert state.word == word
    assert str(state) == (word if slurm == word else f"{word} (Slurm: {slurm})")


def test_a_run_here_says_its_state_from_its_directory(tmp_path: Path):
    assert run_state(_run(tmp_path / "done", 4)).word == "COMPLETED"
    stopped = _run(tmp_path / "stopped", 2)
    assert run_state(stopped).word == "STOPPED" and run_state(stopped).can_continue
    lock = RunLock(stopped).acquire()
    try:
        assert run_state(stopped).word == "RUNNING"
    finally:
        lock.release()
    failed = _run(tmp_path / "failed", 2)
    write_error_record(failed, 0, "ValueError", "boom")
    assert run_state(failed).word == "FAILED" and RunDir(failed).error_files()
