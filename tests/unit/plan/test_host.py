"""The plan's host memory (hpctrain.plan.host): each part a run adds to a rank's, the node's total, and how
it compares with cluster.mem; ``hpctrain plan`` prints it."""

from __future__ import annotations

import pytest

from hpctrain.plan.estimate import estimate
from hpctrain.plan.host import (
    LOADER_BYTES,
    NODE_BYTES,
    PROCESS_BYTES,
    WRITER_BYTES,
    host_memory,
    host_table,
    planned,
)
from tests.support.configs import typed


def test_a_cpu_run_keeps_everything_in_host_memory():
    cfg = typed("cluster.nproc=2")
    est = estimate(cfg)
    host = host_memory(cfg, est)
    assert host.per_rank == {"process": PROCESS_BYTES, "model, activations, buffers": est.largest.total}
    assert host.ranks_per_node == 2 and host.node_total == 2 * host.rank_total + NODE_BYTES
    assert planned(cfg).host == host.rank_total and planned(cfg).gpu is None


def test_staging_the_fast_tier_and_loaders_add_their_copies():
    cfg = typed("cluster.nproc=2", "trainer.async_checkpoint=true", "data.num_workers=2")
    est = estimate(cfg)
    state = est.largest.params + est.largest.optimizer
    parts = host_memory(cfg, est).per_rank
    assert parts["checkpoint writer and staging"] == WRITER_BYTES + state
    assert parts["data loader processes"] == 3 * LOADER_BYTES


def test_a_gpu_node_counts_its_processes_and_says_what_it_leaves_out():
    cfg = typed("cluster=a100x32", "cluster.example=false")
    host = host_memory(cfg, estimate(cfg))
    assert host.per_rank == {"process": PROCESS_BYTES} and host.ranks_per_node == 8
    assert any("CUDA runtime's own host pages" in line for line in host_table(cfg, estimate(cfg)))


@pytest.mark.parametrize(("mem", "words"), [("64G", "to spare"), ("1G", "DOES NOT FIT")])
def test_cluster_mem_is_the_nodes_limit(mem: str, words: str):
    cfg = typed("cluster=slurm_test", f"cluster.mem={mem}", "cluster.tasks_per_node=2", "data.num_workers=2")
    lines = host_table(cfg, estimate(cfg))
    assert (
        lines[0] == "host memory per node (2 ranks)"
        and f"cluster.mem={mem}: " in lines[-1]
        and words in lines[-1]
    )
