"""The Slurm task's agent (hpctrain.launch.agent) and its node's shared fork server's socket
(hpctrain.launch.nodeserver): when a task is an agent, how agents that did not claim a fault learn its
outcome, where the node's tasks meet."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import write_run_config
from hpctrain.launch import agent, nodeserver
from hpctrain.rundir import RunDir


@pytest.mark.parametrize(
    ("overrides", "is_agent"),
    [
        (["cluster=slurm_test"], True),  # 2 tasks per node: they share a fork server
        (["cluster=slurm_test", "cluster.tasks_per_node=1"], False),  # the task is its worker
        (["cluster=slurm_test", "cluster.tasks_per_node=1", "cluster.max_restarts=2"], True),
        (["cluster=slurm_test", "cluster.fork_server=false"], False),
    ],
)
def test_a_task_is_its_ranks_agent_where_restarts_a_check_or_a_shared_node_ask(
    tmp_path: Path, overrides: list[str], is_agent: bool
):
    write_run_config(tmp_path, compose(overrides))
    assert agent.task_is_agent(tmp_path) is is_agent
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
