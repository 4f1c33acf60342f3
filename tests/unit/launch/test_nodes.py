"""A lost node's answer (hpctrain.launch.nodes), in this process: which node takes a lost node's place, when
the job shrinks instead and when it cannot, which nodes look lost, the ranks a member's worker is given, the
shrunk run's shape and what ``hpctrain status`` says. (The real loss of a node: tests/slurm/test_nodes.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpctrain.config.shape import run_shape
from hpctrain.config.shrink import on_nodes
from hpctrain.errors import ConfigError
from hpctrain.launch.nodes import LOST_AFTER_S, Nodes, Replacement, first_members, replace_lost
from hpctrain.launch.supervision import summary
from hpctrain.rendezvous.env import NODES_ENV, task_from_environ
from tests.support.configs import typed

ALLOCATION = ["node1", "node2", "node3", "node4"]


def test_a_spare_takes_the_lost_place_and_the_survivors_keep_their_ranks() -> None:
    got = replace_lost(["node1", "node2", "node3"], ["node2"], ["node1", "node3", "node4"], 3, 3)
    assert got == Replacement(["node1", "node4", "node3"], ["node2"], ["node4"], shrunk=False)


def test_without_a_spare_the_lost_place_is_left_out_down_to_min_nodes() -> None:
    assert replace_lost(["node1", "node2"], ["node2"], ["node1"], 2, 1) == Replacement(
        ["node1"], ["node2"], [], shrunk=True
    )
    # Two lost, one spare: the first lost place is taken, the second left out.
    got = replace_lost(["node1", "node2", "node3"], ["node1", "node3"], ["node2", "node4"], 3, 2)
    assert got == Replacement(["node4", "node2"], ["node1", "node3"], ["node4"], shrunk=True)
    # Below min_nodes: no restart inside the allocation (a requeue without the node, as before).
    assert replace_lost(["node1", "node2"], ["node2"], ["node1"], 2, 2) is None


def test_a_shrunk_job_grows_back_onto_a_spare() -> None:
    got = replace_lost(["node1", "node3"], ["node3"], ["node1", "node4"], 3, 1)
    assert got == Replacement(["node1", "node4"], ["node3"], ["node4"], shrunk=True)
    got = replace_lost(["node1"], ["node1"], ["node2", "node4"], 2, 1)
    assert got == Replacement(["node2", "node4"], ["node1"], ["node2", "node4"], shrunk=False)


def test_the_first_members_leave_out_the_nodes_the_run_lost() -> None:
    assert first_members(ALLOCATION, set(), 2) == ["node1", "node2"]
    assert first_members(ALLOCATION, {"node1"}, 2) == ["node2", "node3"]


def test_a_node_whose_agents_all_went_quiet_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    nodes = Nodes(tmp_path, "7.r0", wanted=2, min_nodes=1)
    now = time.time()
    for node, local, age in [("node1", 0, 0.1), ("node2", 0, 9.0), ("node2", 1, 0.5), ("node3", 0, 9.0)]:
        path = nodes.rd.agent_alive("7.r0", node, local)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (now - age, now - age))
    # node2 still has one agent answering; node3's went quiet; node4 never answered at all.
    assert nodes.stale(["node1", "node2", "node3", "node4"], now) == ["node3", "node4"]
    assert LOST_AFTER_S < 9.0


def test_a_members_worker_gets_the_ranks_of_its_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_NTASKS": "6",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURMD_NODENAME": "node3",
        "SLURM_TASKS_PER_NODE": "2(x3)",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    place = Nodes(tmp_path, "42.r0", wanted=2, min_nodes=None).place(["node1", "node3"])
    assert place == {NODES_ENV: "node1,node3", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODEID": "1"}
    dist = task_from_environ({**env, **place})
    assert dist is not None
    assert (dist.rank, dist.world_size, dist.local_world_size, dist.master_addr) == (3, 4, 2, "node1")


def test_a_shrunk_run_keeps_its_global_batch_by_more_passes() -> None:
    cfg = typed("cluster=slurm_test", "cluster.max_restarts=1", "cluster.min_nodes=1")
    full, half = run_shape(cfg), run_shape(on_nodes(cfg, 1))
    assert (full.world_size, full.dp, full.passes) == (4, 4, 1)
    assert (half.world_size, half.dp, half.passes) == (2, 2, 2)
    assert half.global_batch_size == full.global_batch_size


def test_a_layout_spanning_the_lost_node_cannot_shrink() -> None:
    cfg = typed("cluster=slurm_test", "parallel=2d", "parallel.tp=4", "model.n_heads=4")
    with pytest.raises(ConfigError, match=r"cluster.min_nodes.*on 1 node the layout cannot run"):
        on_nodes(cfg, 1)


def test_status_says_which_node_was_lost_and_what_took_its_place() -> None:
    base = {"time": 0.0, "action": "restart", "rank": None, "host": "node2", "cause": "lost node node2"}
    lines = summary(
        [
            {**base, "lost": ["node2"], "spares": ["node3"], "nodes": ["node1", "node3"], "shrunk": False},
            {**base, "lost": ["node3"], "spares": [], "nodes": ["node1"], "shrunk": True},
        ]
    )
    assert "node node2 lost" in lines[1] and "replaced by node3 (now on node1, node3)" in lines[1], lines
    assert "node node3 lost" in lines[2] and "left out; shrunk to 1 nodes (now on node1)" in lines[2], lines
