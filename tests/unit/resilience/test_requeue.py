"""Requeue on a fault or a stop (hpctrain.resilience.requeue), against fake Slurm clients on PATH
(tests/support/fake_slurm.py): the culprit's node excluded, retries logged, a refused requeue fails the job
saying why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hpctrain.resilience import requeue
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from tests.support.fake_slurm import SHOW_JOB, Fake


def test_a_fault_requeues_without_the_culprits_node(fake: Fake, tmp_path: Path):
    fake.answer("sacct", "RUNNING\n")
    fake.answer("scontrol", SHOW_JOB)
    fake.answer("sinfo", "node[1-4]\n")
    culprit = Heartbeat(rank=1, host="node2", pid=1, step=7, phase="forward", since=0.0, written=0.0)
    requeue.respond_to_fault(tmp_path, "12", culprit, "hang", max_requeues=3)
    assert fake.calls()[1:] == [
        "scontrol show job 12",
        "sinfo --noheader --partition gpu --format %N",
        "scontrol requeue 12",
        "scontrol update JobId=12 ExcNodeList=node2",
    ]
    assert "node2" in RunDir(tmp_path).faults.read_text()


def test_a_requeue_that_keeps_failing_is_tried_five_times_and_logged(
    fake: Fake, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    fake.answer("sacct", "RUNNING\n")
    fake.answer("scontrol", "slurm_requeue error: busy", rc=1)
    with caplog.at_level(logging.WARNING):
        requeue.respond_to_fault(tmp_path, "12", None, "hang", max_requeues=3)
    assert fake.calls()[1:] == ["scontrol requeue 12"] * 5
    assert "scontrol requeue 12 failed (exit 1): slurm_requeue error: busy" in caplog.text


def test_a_stop_requeues_once_from_rank_0(fake: Fake, caplog: pytest.LogCaptureFixture):
    fake.answer("sacct", "RUNNING\n")
    fake.answer("scontrol.requeue", "slurm_requeue error: busy", rc=1)
    fake.answer("scontrol", SHOW_JOB.replace("JobState=RUNNING", "JobState=REQUEUED"))
    with caplog.at_level(logging.WARNING):
        requeue.requeue_or_fail("12", "SIGUSR2", 40, max_requeues=3, is_main=True)
    # One try: a pre-empting partition requeues the job itself, and then the failure is only logged.
    assert fake.calls()[1:] == ["scontrol requeue 12", "scontrol show job 12"]
    assert "scontrol requeue 12 failed" in caplog.text
    fake.answer("sacct", "CANCELLED by 0\n")
    requeue.requeue_or_fail("12", "SIGTERM", 41, max_requeues=3, is_main=True)
    assert fake.calls()[-1].startswith("sacct")


def test_a_refused_requeue_fails_the_job_with_the_reason(fake: Fake):
    """The job must end FAILED saying why, not COMPLETED as if training had finished."""
    fake.answer("sacct", "RUNNING\n")
    fake.answer("scontrol.requeue", "Requested operation is presently disabled", rc=1)
    fake.answer("scontrol", SHOW_JOB)  # still RUNNING: nobody else requeues it
    with pytest.raises(requeue.RequeueFailed, match=r"scontrol requeue 12 failed: .*presently disabled"):
        requeue.requeue_or_fail("12", "SIGUSR2", 40, max_requeues=3, is_main=True)


def test_array_tasks_are_named_as_slurm_commands_need(monkeypatch: pytest.MonkeyPatch):
    from hpctrain.resilience.requeue import slurm_job_id

    monkeypatch.delenv("HPCTRAIN_LAUNCHER_PID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "24")  # a task's own id can equal its array's id
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "24")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert slurm_job_id() == "24_1"
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    assert slurm_job_id() == "24"
