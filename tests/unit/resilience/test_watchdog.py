"""The hang watchdog times only a train step's own work, and blames only ranks of the current job start."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpctrain.resilience import watchdog as wd
from hpctrain.rundir import RunDir


def _watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[wd.Watchdog, list[float]]:
    fired: list[float] = []
    # Record instead of dumping stacks and ending the process.
    monkeypatch.setattr(wd.Watchdog, "_fire", lambda self, age, limit: fired.append(age))
    monkeypatch.setattr(wd, "HEARTBEAT_S", 0.1)
    dog = wd.Watchdog(tmp_path, 0, "node1", factor=2.0, min_s=0.3, on_hang=lambda *_: None)
    for _ in range(3):
        dog.step_done(0.01)  # a baseline: the limit is max(2 × median, 0.3 s)
    return dog, fired


def test_a_long_save_or_evaluation_is_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dog, fired = _watchdog(tmp_path, monkeypatch)
    try:
        dog.enter(1, "data")
        dog.enter(1, "compute")
        dog.enter(1, "report")  # evaluation, 4× the limit
        time.sleep(1.2)
        dog.enter(1, "checkpoint")  # a slow save
        time.sleep(1.2)
        assert fired == []
        dog.enter(2, "data")
        dog.enter(2, "compute")  # a train step that hangs
        time.sleep(1.2)
        assert len(fired) == 1 and fired[0] > 0.3
    finally:
        dog.close()


def test_heartbeats_of_an_earlier_job_start_are_not_evidence(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.heartbeats.mkdir()
    old = {"rank": 3, "host": "node4", "pid": 1, "step": 9, "phase": "compute", "since": 0.0, "written": 0.0}
    rd.heartbeat(3).write_text(json.dumps({**old, "job": "slurm:77.0"}))  # before the requeue
    now = {**old, "rank": 0, "host": "node1", "written": time.time(), "job": "slurm:77.1"}
    rd.heartbeat(0).write_text(json.dumps(now))
    beats = wd.read_heartbeats(tmp_path, wd.job_key({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}))
    assert [b.rank for b in beats] == [0]
    culprit, _ = wd.find_culprit(beats, time.time())
    assert culprit is None or culprit.host != "node4"
    # Files of an older version (no job field) still parse, and count only when no job is asked for.
    rd.heartbeat(5).write_text(json.dumps({**old, "rank": 5}))
    assert {b.rank for b in wd.read_heartbeats(tmp_path)} == {0, 3, 5}


def test_a_live_process_whose_heartbeat_stood_still_is_stalled_in_any_phase(tmp_path: Path) -> None:
    """What a supervisor reads (watchdog.stalled): its worker's own beat, older than STALE_AFTER_S, from that
    live process; a real SIGSTOPped process is named as stopped."""
    import signal
    import subprocess

    worker = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(worker.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10  # a signal is delivered, not waited for
        while wd._process_state(worker.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        now = time.time()

        def beat(**fields: object) -> None:
            record = {
                "rank": 1,
                "host": "node1",
                "pid": worker.pid,
                "step": 7,
                "phase": "report",
                "since": now,
            }
            record.update(written=now - wd.STALE_AFTER_S - 1, job="local:x", **fields)
            RunDir(tmp_path).heartbeat(1).parent.mkdir(parents=True, exist_ok=True)
            RunDir(tmp_path).heartbeat(1).write_text(json.dumps(record))

        assert wd.stalled(tmp_path, 1, worker.pid, now) is None  # no beat yet: still starting
        beat()
        stalled = wd.stalled(tmp_path, 1, worker.pid, now)
        assert stalled is not None and (stalled.step, stalled.phase) == (7, "report")
        why = wd.stalled_why(stalled, now)
        assert (
            why
            == "no heartbeat for 4 s while the process lives: stopped (SIGSTOP); last seen in step 7 (report)"
        )
        assert wd.stalled(tmp_path, 1, worker.pid + 1, now) is None  # another process's (an earlier start's)
        assert wd.stalled(tmp_path, 1, worker.pid, now - 2) is None  # not yet older than STALE_AFTER_S
        beat(closed=True)  # the loop ended: whatever it does now (closing loggers) is no hang
        assert wd.stalled(tmp_path, 1, worker.pid, now) is None
        os.kill(worker.pid, signal.SIGCONT)
        while wd._process_state(worker.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        beat()
        assert "its threads do not run" in wd.stalled_why(wd.stalled(tmp_path, 1, worker.pid, now), now)  # type: ignore[arg-type]
    finally:
        worker.kill()
        worker.wait()


def test_the_last_beat_says_the_loop_ended(tmp_path: Path) -> None:
    dog = wd.Watchdog(tmp_path, 0, "node1", factor=0.0, min_s=1.0, on_hang=lambda *_: None)
    assert json.loads(RunDir(tmp_path).heartbeat(0).read_text())["closed"] is False
    dog.close()
    assert json.loads(RunDir(tmp_path).heartbeat(0).read_text())["closed"] is True
