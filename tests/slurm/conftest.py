"""Session-wide real Slurm cluster (3 nodes, accounting) for the tests under tests/slurm.

Skipped when it cannot start (not root, no apt, ...), unless CI=true or HPCTRAIN_REQUIRE_SLURM=1:
then the tests fail with the reason, so a CI machine can never silently skip them.

HPCTRAIN_SLURM_TEST_WORKDIR=DIR reuses a cluster brought up by hand with
``python -m tests.slurm.cluster up --workdir DIR`` (and leaves it running), for fast edit-test cycles.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import SlurmClusterError, SlurmTestCluster


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("HPCTRAIN_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestCluster]:
    """A running 3-node cluster; SLURM_CONF/PATH are exported for the whole session.

    Exported because submitit and anything else that shells out to sbatch/sacct from this
    process must reach this cluster, and a Slurm client without SLURM_CONF falls back to DNS
    look-ups that leave the machine.
    """
    existing = os.environ.get("HPCTRAIN_SLURM_TEST_WORKDIR")
    if existing:
        cluster = SlurmTestCluster.from_workdir(Path(existing))
        with pytest.MonkeyPatch.context() as mp:
            for key, value in cluster.env().items():
                mp.setenv(key, value)
            yield cluster
        return
    # 4 CPU slots per node (the nodes share this machine's cores): room for 4 tasks per node, as the
    # 8-task 3d layout needs.
    cluster = SlurmTestCluster(tmp_path_factory.mktemp("slurm"), num_nodes=3, cpus_per_node=4)
    try:
        cluster.start(timeout=90)
    except (SlurmClusterError, OSError) as exc:
        reason = f"Slurm test cluster could not start: {exc}"
        if _required():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in cluster.env().items():
                mp.setenv(key, value)
            yield cluster
    finally:
        cluster.stop()
