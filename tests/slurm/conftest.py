"""Session-wide real Slurm cluster (3 nodes, accounting) for the tests under tests/slurm.

Skipped when it cannot start (not root, no apt, ...), unless CI=true or HPCTRAIN_REQUIRE_SLURM=1:
then the tests fail with the reason, so a CI machine can never silently skip them.

HPCTRAIN_SLURM_TEST_WORKDIR=DIR reuses a cluster brought up by hand with
``python -m tests.slurm.cluster up --workdir DIR`` (and leaves it running), for fast edit-test cycles.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.rundir.records import read_job, read_sweep
from tests.support import FAST, hpctrain

from .cluster import SlurmClusterError, SlurmTestCluster

SLURM_TIER_NICE = -10


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("HPCTRAIN_REQUIRE_SLURM") == "1"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmTestCluster]:
    """A running 3-node cluster for the session (its SLURM_CONF/PATH: :func:`_slurm_env`)."""
    existing = os.environ.get("HPCTRAIN_SLURM_TEST_WORKDIR")
    if existing:
        yield SlurmTestCluster.from_workdir(Path(existing))
        return
    # The Slurm tier is the suite's longest path: one xdist worker runs it from the start (~690 s alone, over
    # 1,100 s in CI), mostly waiting on jobs, submissions and daemons that share the 2 cores with the local
    # tier's ranks. This process, and all it starts from here on (the daemons, hence every job's tasks, which
    # inherit slurmd's niceness with PropagatePrioProcess=0; the submissions; the local reference runs), come
    # first on a contended core: nice -10 is about 9 × a normal process's share (CFS weights 9548 vs 1024).
    # At nice -5 (3 ×) it still ended last: a whole suite here had the Slurm worker end at 1,058 s, both local
    # workers at 993 s, one core idle for the difference.
    with contextlib.suppress(OSError):  # not root: as it is
        os.setpriority(os.PRIO_PROCESS, 0, SLURM_TIER_NICE)
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
    with _cluster_env(slurm_cluster):
        yield


@contextlib.contextmanager
def _cluster_env(slurm_cluster: SlurmTestCluster) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in slurm_cluster.env().items():
            mp.setenv(key, value)
        yield


# Jobs that several modules look at alike, submitted once per session (the Slurm tier runs on one xdist
# worker, so a session fixture is shared by all its modules): each task of a job is a fresh interpreter that
# imports torch (~4.5 CPU-s on this machine), and a job that two tests submit alike costs that twice.
# Session fixtures are set up before the module-scoped _slurm_env: they export the cluster's env themselves.


@dataclass
class Submitted:
    """A job as ``hpctrain`` submitted it: the CLI's output and how long the submission took."""

    run: Path
    job_id: str
    result: subprocess.CompletedProcess[str]
    submit_s: float


def _submit(slurm_cluster: SlurmTestCluster, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``hpctrain ARGS`` against the cluster (a session fixture may be asked for before _slurm_env), and how
    long it took; it must succeed."""
    with _cluster_env(slurm_cluster):
        started = time.monotonic()
        result = hpctrain(*args)
        submit_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    return result, submit_s


# 2 nodes × 2 tasks of the 2-layer GPT on node1 + node2 (node3 excluded, so where the ranks run is known),
# 10 steps, seed 7; with sbatch options as people know them (a comment, --exclusive).
TWO_NODE_DDP = [
    "cluster=slurm_test",
    "trainer.max_steps=10",
    "trainer.seed=7",
    "cluster.exclude=node3",
    *FAST,
    "cluster.additional.comment=hpctrain-test",
    "cluster.exclusive=true",
]


@pytest.fixture(scope="session")
def two_node_ddp(slurm_cluster: SlurmTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Submitted:
    """One 2-node × 2-task DDP run through submitit (:data:`TWO_NODE_DDP`), submitted, not waited for:
    test_submit.py checks the submission and the run; test_sbatch.py trains the same thing through the
    sbatch template and compares."""
    run = tmp_path_factory.mktemp("two_node_ddp") / "run"
    result, submit_s = _submit(slurm_cluster, *TWO_NODE_DDP, f"hydra.run.dir={run}")
    record = read_job(run)
    assert record is not None
    return Submitted(run, record.job_id, result, submit_s)


# A 4-member sweep as one job array, 1 node × 2 tasks a member, 12 steps: two learning rates, each once
# completing and once failing on rank 1 at step 5.
SWEEP = [
    "cluster=slurm_test",
    "cluster.nodes=1",
    "trainer.max_steps=12",
    "trainer.log_every=3",
    "trainer.eval_every=6",
    *FAST,
    "optim.lr=1e-3,3e-3",
    "faults.fail_at=null,'1:5'",
]


@pytest.fixture(scope="session")
def slurm_sweep(slurm_cluster: SlurmTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Submitted:
    """The :data:`SWEEP` array, submitted, not waited for (``job_id``: the array's): test_submit.py checks it
    is one array, test_report.py reports on it."""
    sweep = tmp_path_factory.mktemp("slurm_sweep") / "sweep"
    result, submit_s = _submit(slurm_cluster, "-m", *SWEEP, f"hydra.sweep.dir={sweep}")
    record = read_sweep(sweep)
    assert record is not None
    return Submitted(sweep, record.array_job_id, result, submit_s)
