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
    """A running 3-node cluster for the session (its SLURM_CONF/PATH: :func:`_slurm_env`)."""
    existing = os.environ.get("HPCTRAIN_SLURM_TEST_WORKDIR")
    if existing:
        yield SlurmTestCluster.from_workdir(Path(existing))
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
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module", autouse=True)
def _slurm_env(slurm_cluster: SlurmTestCluster) -> Iterator[None]:
    """SLURM_CONF/PATH exported while a module of tests/slurm runs (before its own module fixtures), and only
    then: submitit and anything else that shells out to sbatch/sacct from this process must reach this
    cluster (a Slurm client without SLURM_CONF falls back to DNS look-ups that leave the machine), while a
    test elsewhere that this xdist worker runs afterwards must not find a cluster it did not ask for (the
    partition check of a submission would ask it)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in slurm_cluster.env().items():
            mp.setenv(key, value)
        yield
