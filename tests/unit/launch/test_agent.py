"""The Slurm task's agent (hpctrain.launch.agent) and its node's shared fork server's socket
(hpctrain.launch.nodeserver): how the agent that claims a fault answers it (a restart, a requeue, the end),
how agents that did not claim it learn its outcome, where the node's tasks meet."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch import agent, nodeserver, supervision, supervisor
from hpctrain.resilience import policy
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_json
from hpctrain.rundir.records import KILLED, first_error, read_error_record, record_killed, write_error_record
from tests.support.fake_slurm import SHOW_JOB, Fake


def test_with_restarts_off_the_agent_answers_a_killed_rank_with_a_requeue_without_its_node(
    fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The worker records and exits; its agent asks the policy and carries out its answer (issue 42)."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    fake.answer("sacct", "RUNNING\n")
    fake.answer("scontrol", SHOW_JOB)
    fake.answer("sinfo", "node[1-4]\n")
    book = supervision.RestartBook(tmp_path, "12.r0", 0, 3, max_requeues=2, slurm_job="12")
    _beat(tmp_path, 3, 9, "12.r0")
    killed = supervision.Outcome(3, "node2", "was killed by SIGKILL")
    action = supervision.answer_fault(book, 0, killed, time.time(), 0, "12.r0")
    assert action == policy.Requeue(("node2",))
    assert fake.calls()[1:] == [
        "scontrol show job 12",
        "sinfo --noheader --partition gpu --format %N",
        "scontrol requeue 12",
        "scontrol update JobId=12 ExcNodeList=node2",
    ]
    (record,) = RunDir(tmp_path).read_answers()
    assert (record["action"], record["exclude"], record["rank"]) == ("requeue", ["node2"], 3), record
    assert book.generation() == 0 and book.ended_without_restart(0)  # the other agents stop waiting
    (fault,) = RunDir(tmp_path).read_faults()
    assert (fault["rank"], fault["host"], fault["step"]) == (3, "node2", 9), fault
    assert fault["action"] == "requeue without node2"


def test_past_the_requeue_cap_the_agent_ends_the_run_saying_why(
    fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    book = supervision.RestartBook(tmp_path, "12.r2", 0, 3, max_requeues=2, slurm_job="12")
    killed = supervision.Outcome(1, "node1", "was killed by SIGKILL")
    action = supervision.answer_fault(book, 0, killed, time.time(), 0, "k")
    assert isinstance(action, policy.Fail) and "already requeued 2 times" in action.why, action
    assert fake.calls() == []  # no scontrol: nothing is requeued
    (record,) = RunDir(tmp_path).read_answers()
    assert record["action"] == supervision.USED_UP and "cluster.max_requeues=2" in record["why"], record
    assert RunDir(tmp_path).read_faults()[0]["action"] == "the run ends (CapsUsedUp)"


def _book(tmp_path: Path) -> supervision.RestartBook:
    return supervision.RestartBook(tmp_path, "7.r0", max_restarts=1, max_no_progress=3)


def test_an_agent_waiting_on_a_claimed_fault_stops_when_no_restart_is_left(tmp_path: Path):
    book = _book(tmp_path)
    outcome = supervision.Outcome(3, "node2", "was killed by SIGKILL")
    book.decide(0, outcome, time.time(), 0, "7.r0.g0")  # restart 1 of 1: the generation moves on
    assert book.generation() == 1 and supervisor.wait_for_word(book, 0)
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(supervisor.wait_for_word(book, 1)))
    waiter.start()
    time.sleep(0.2)
    assert book.decide(1, outcome, time.time(), 0, "7.r0.g1") is False  # used up: the generation stays
    waiter.join(timeout=10)
    assert waited == [False], "the waiter returns (its worker's own answer stands) instead of waiting forever"
    actions = [r["action"] for r in RunDir(tmp_path).read_answers()]
    assert actions == ["restart", supervision.USED_UP]
    assert not book.ended_without_restart(0) and book.ended_without_restart(1)


def _beat(tmp_path: Path, rank: int, step: int, key: str) -> None:
    beat = Heartbeat(rank, "node2", 1, step, "compute", time.time(), time.time(), key)
    RunDir(tmp_path).heartbeats.mkdir(exist_ok=True)
    atomic_json(RunDir(tmp_path).heartbeat(rank), asdict(beat))


RAISED = "failed with exit code 1: ValueError: shapes (4, 3) and (5,) do not match"
# (the faults of successive attempts: (cause, the failing rank's step), the actions taken)
REPEATS = [
    # The same error at the same step twice: the run's own bug; the second is not restarted.
    ([(RAISED, 7), (RAISED, 7)], ["restart", "stopped"]),
    # The same error at another step, or another error at the same step: a restart each.
    ([(RAISED, 7), (RAISED, 9)], ["restart", "restart"]),
    ([(RAISED, 7), ("failed with exit code 1: OSError: disk full", 7)], ["restart", "restart"]),
    # A signal is no bug of the run's: a rank killed at the same step twice is restarted again.
    ([("was killed by SIGKILL", 7), ("was killed by SIGKILL", 7)], ["restart", "restart"]),
]


@pytest.mark.parametrize(("faults", "actions"), REPEATS)
def test_the_same_error_at_the_same_step_twice_is_not_restarted(
    tmp_path: Path, faults: list[tuple[str, int]], actions: list[str]
):
    book = supervision.RestartBook(tmp_path, "7.r0", max_restarts=3, max_no_progress=3)
    for generation, (cause, step) in enumerate(faults):
        key = f"7.r0.g{generation}"
        _beat(tmp_path, 1, step, key)
        book.decide(generation, supervision.Outcome(1, "node2", cause), time.time(), 0, key)
    records = RunDir(tmp_path).read_answers()
    assert [r["action"] for r in records] == actions, records
    if actions[-1] == "stopped":
        assert book.generation() is None and records[-1]["error"] == supervision.REPEATED
        why = records[-1]["why"]
        assert why.startswith("not restarted: the same error at step 7 twice") and why.endswith(RAISED), why
        assert supervision.summary(records)[-1] == why  # what `hpctrain status` shows under restarts


@pytest.mark.parametrize(
    ("overrides", "restarts"),
    [
        (["cluster=slurm_test"], 3),  # on Slurm: a first fault answered inside the allocation
        ([], 0),  # cluster=local: the user watches; their bug's traceback comes at once
        (["cluster=slurm_test", "cluster.max_restarts=0"], 0),  # what was typed stands
        (["cluster.max_restarts=2"], 2),
    ],
)
def test_restarts_are_on_by_default_on_slurm(overrides: list[str], restarts: int):
    assert to_typed(compose(overrides)).cluster.max_restarts == restarts


def test_a_killed_rank_is_recorded_by_its_observer_and_named_by_status(tmp_path: Path):
    """A SIGKILLed rank records nothing; its peer's error is a connection reset. The observer's record names
    the killed rank, which first_error (hpctrain status's error line) prefers over the peer's symptom."""
    write_error_record(tmp_path, 0, "DistBackendError", "Connection reset by peer ... GLHF!")
    record_killed(tmp_path, 1, signal.SIGKILL, restarts=0)
    rank, record = first_error(tmp_path) or (None, {})
    assert rank == 1 and record["type"] == KILLED, record
    assert record["message"].startswith("was killed by SIGKILL; cluster.max_restarts=N restarts")
    record_killed(tmp_path, 1, signal.SIGTERM, restarts=2)  # an existing record (its own words) stands
    assert read_error_record(tmp_path, 1) == record
    record_killed(tmp_path, 2, signal.SIGKILL, restarts=2)  # restarts on: no hint
    assert read_error_record(tmp_path, 2)["message"] == "was killed by SIGKILL"


def test_the_nodes_socket_is_named_for_the_step_and_host_in_a_private_directory(monkeypatch):
    tmp_path = Path(tempfile.mkdtemp(prefix="ns", dir="/tmp"))  # short: a socket's path holds 108 bytes
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # $TMPDIR, as tempfile read it
    step = {"SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}
    path = nodeserver.socket_path(step, "7_2.r1", "node3")
    assert path == f"{tmp_path}/hpctrain-{os.getuid()}/fs-7_2.r1.0-node3.sock"
    assert (Path(path).parent.stat().st_mode & 0o777) == 0o700
    assert nodeserver.socket_path({"SLURM_STEP_ID": "0"}, "7.r0", "node3") is None  # not a Slurm task
    assert nodeserver.socket_path(step, "7.r0", "x" * 120) is None  # longer than a socket's address holds
    long = Path(tmp_path) / ("t" * 80)
    long.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long))
    assert nodeserver.socket_path(step, "7.r0", "node3") is None  # a $TMPDIR too long for a socket's path
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    os.chmod(Path(path).parent, 0o755)  # others may enter: no socket of ours there
    assert nodeserver.socket_path(step, "7.r0", "node3") is None
    shutil.rmtree(tmp_path)


def test_a_job_start_is_named_by_its_array_member_and_slurms_restart_count(monkeypatch: pytest.MonkeyPatch):
    """The agents of one job start meet in files named by it: a requeue (Slurm's restart count) is another
    start, and an array member is named as squeue names it."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert agent.slurm_job_start() == "77.r0"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert agent.slurm_job_start() == "70_3.r2"
