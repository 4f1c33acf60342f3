"""What a job asks of Slurm from inside itself (hpctrain.slurm.commands, used by hpctrain.resilience), against
fake clients on PATH: each records its arguments and answers with a canned output and exit status."""

from __future__ import annotations

import logging
import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from hpctrain.resilience import requeue
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from hpctrain.slurm import commands

# A canned answer per client, or per client and first word (``scontrol.requeue.rc``) when one is given.
FAKE = """#!/bin/sh
name=$(basename "$0")
echo "$name $*" >> "$FAKE_DIR/calls"
[ -f "$FAKE_DIR/$name.$1.rc" ] && name="$name.$1"
[ -f "$FAKE_DIR/$name.out" ] && cat "$FAKE_DIR/$name.out"
exit $(cat "$FAKE_DIR/$name.rc" 2>/dev/null || echo 0)
"""
SHOW_JOB = """JobId=12 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=gpu AllocNode:Sid=login1:4242
   ReqNodeList=(null) ExcNodeList=(null)
   NumNodes=2-2 NumCPUs=16 NumTasks=2
   Comment=a comment with spaces
"""


class Fake:
    def __init__(self, root: Path) -> None:
        self.root = root

    def answer(self, name: str, out: str = "", rc: int = 0) -> None:
        (self.root / f"{name}.out").write_text(out)
        (self.root / f"{name}.rc").write_text(str(rc))

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    root = tmp_path / "fake"
    root.mkdir()
    for name in ("sacct", "scontrol", "sinfo", "squeue"):
        path = root / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{root}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(root))
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.setattr(commands.time, "sleep", lambda s: None)
    return Fake(root)


def test_cancelled_from_accounting_or_from_a_job_slurm_is_ending(fake: Fake):
    fake.answer("sacct", "CANCELLED by 1000\n")
    assert commands.was_cancelled("12")
    fake.answer("sacct", "RUNNING\n")
    assert not commands.was_cancelled("12")
    fake.answer("sacct", "", rc=1)  # no accounting: scontrol's JobState decides
    fake.answer("scontrol", SHOW_JOB.replace("RUNNING", "COMPLETING"))
    assert commands.was_cancelled("12")
    fake.answer("scontrol", SHOW_JOB)
    assert not commands.was_cancelled("12")
    assert fake.calls()[0] == "sacct --noheader --allocations --jobs 12 --format State%40"
    assert fake.calls()[-1] == "scontrol show job 12"


def test_job_fields_and_partition_nodes(fake: Fake):
    fake.answer("scontrol", SHOW_JOB)
    fields = commands.job_fields("12")
    assert (fields["Partition"], fields["ExcNodeList"], fields["NumNodes"]) == ("gpu", "(null)", "2-2")
    assert fields["Comment"] == "a comment with spaces"
    fake.answer("scontrol", "", rc=1)
    assert commands.job_fields("12") == {}
    fake.answer("sinfo", "node[1-3]\ngpu7\n")
    assert commands.partition_nodes("gpu") == {"node1", "node2", "node3", "gpu7"}
    assert fake.calls()[-1] == "sinfo --noheader --partition gpu --format %N"


def test_end_time(fake: Fake):
    fake.answer("squeue", "2030-01-02T03:04:05\n")
    assert commands.end_time("12") == datetime(2030, 1, 2, 3, 4, 5).timestamp()
    assert fake.calls() == ["squeue --noheader --jobs 12 --format %e"]
    for out, rc in (("N/A\n", 0), ("", 0), ("2030-01-02T03:04:05\n", 1)):
        fake.answer("squeue", out, rc)
        assert commands.end_time("12") is None


def test_end_time_without_squeue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert commands.end_time("12") is None


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
