"""The Slurm task's agent (hpctrain.launch.agent) and its node's shared fork server's socket
(hpctrain.launch.nodeserver): when a task is an agent, how agents that did not claim a fault learn its
outcome, where the node's tasks meet."""

from __future__ import annotations

import json
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
from hpctrain.config.io import load_run_config, write_run_config
from hpctrain.launch import agent, nodeserver
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_json
from hpctrain.rundir.records import KILLED, first_error, read_error_record, record_killed, write_error_record


@pytest.mark.parametrize(
    ("overrides", "is_agent"),
    [
        (["cluster=slurm_test"], True),  # 2 tasks per node: they share a fork server
        (["cluster=slurm_test", "cluster.tasks_per_node=1", "cluster.max_restarts=0"], False),  # its worker
        (["cluster=slurm_test", "cluster.tasks_per_node=1"], True),  # restarts: on by default on Slurm
        (["cluster=slurm_test", "cluster.tasks_per_node=1", "cluster.max_restarts=2"], True),
        (["cluster=slurm_test", "cluster.fork_server=false", "cluster.max_restarts=0"], False),
    ],
)
def test_a_task_is_its_ranks_agent_where_restarts_a_check_or_a_shared_node_ask(
    tmp_path: Path, overrides: list[str], is_agent: bool
):
    write_run_config(tmp_path, compose(overrides))
    assert agent.task_is_agent(load_run_config(tmp_path / "config.yaml").cluster) is is_agent
    assert to_typed(compose(overrides)).cluster.tasks_per_node in (1, 2)


def _book(tmp_path: Path) -> agent.RestartBook:
    return agent.RestartBook(tmp_path, "7.r0", max_restarts=1, max_no_progress=3)


def test_an_agent_waiting_on_a_claimed_fault_stops_when_no_restart_is_left(tmp_path: Path):
    book = _book(tmp_path)
    outcome = agent.Outcome(3, "node2", "was killed by SIGKILL")
    book.decide(0, outcome, time.time(), 0, "7.r0.g0")  # restart 1 of 1: the generation moves on
    assert book.generation() == 1 and agent._wait_for_word(book, 0)
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(agent._wait_for_word(book, 1)))
    waiter.start()
    time.sleep(0.2)
    assert book.decide(1, outcome, time.time(), 0, "7.r0.g1") is False  # used up: the generation stays
    waiter.join(timeout=10)
    assert waited == [False], "the waiter returns (its worker's own answer stands) instead of waiting forever"
    actions = [json.loads(line)["action"] for line in RunDir(tmp_path).restarts.read_text().splitlines()]
    assert actions == ["restart", agent.USED_UP]
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
    book = agent.RestartBook(tmp_path, "7.r0", max_restarts=3, max_no_progress=3)
    for generation, (cause, step) in enumerate(faults):
        key = f"7.r0.g{generation}"
        _beat(tmp_path, 1, step, key)
        book.decide(generation, agent.Outcome(1, "node2", cause), time.time(), 0, key)
    records = RunDir(tmp_path).read_restarts()
    assert [r["action"] for r in records] == actions, records
    if actions[-1] == "stopped":
        assert book.generation() is None and records[-1]["error"] == agent.REPEATED
        why = records[-1]["why"]
        assert why.startswith("not restarted: the same error at step 7 twice") and why.endswith(RAISED), why
        assert agent.summary(records)[-1] == why  # what `hpctrain status` shows under restarts


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
