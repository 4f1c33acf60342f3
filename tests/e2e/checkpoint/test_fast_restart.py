"""A restart inside the same job loads the fast tier (node-local copies) and ends bitwise equal to an
uninterrupted run: from each rank's own copy (the CLI, a rank killed with SIGKILL, the run started again
with the same ``HPCTRAIN_JOB_ID``), and from the copies peers keep (two "nodes" of one rank each: rank 1's
own copy lost, rank 0's with a flipped bit, skipped: each loads the copy its peer kept).

A restart agent (issue 27) keeps the job's identity and starts the workers again; here the test does.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from hpctrain.checkpoint.tiers import read_checkpoint
from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, assert_same_state, hpctrain, metrics

STEPS = 8
RUN = [
    *FAST,
    "cluster.nproc=2",
    "model.dropout=0.1",  # every rank's RNG stream must be restored too
    f"trainer.max_steps={STEPS}",
    "trainer.ckpt_every=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
]
FAST_TIER = ["checkpoint.local_every=1"]  # each save waits for the one before: step 6's copy is whole at 8
KILL = "faults.kill_at=1:8"  # rank 1 kills itself (SIGKILL) at the start of step 8: the shared tier has 4


def model_and_optimizer(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = read_checkpoint(checkpoint)["model_optim"]
    out: dict[str, torch.Tensor] = {}

    def walk(tree: object, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(tree, torch.Tensor):
            out[prefix.rstrip(".")] = tree

    walk(state, "")
    return out


def assert_bitwise(run: Path, reference: Path) -> None:
    assert_same_state(run, reference, STEPS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("fast-tier") / "uninterrupted"
    result = hpctrain(*RUN, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_a_killed_rank_restarts_from_its_own_copy_bitwise(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = {"HPCTRAIN_JOB_ID": f"test-{uuid.uuid4().hex[:8]}"}
    killed = hpctrain(*RUN, *FAST_TIER, KILL, f"hydra.run.dir={run}", env=job)
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-2000:]
    assert [p.name for p in layout.committed(run / "checkpoints")] == ["step_00000004"]
    paths = layout.FastTierPaths(Path("/dev/shm"), layout.run_key(run), f"local-{job['HPCTRAIN_JOB_ID']}")
    assert paths.job_root.is_dir(), "the fast tier of a job whose id was given outlives the launch"

    restarted = hpctrain(*RUN, *FAST_TIER, f"hydra.run.dir={run}", env=job)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    log = (run / "logs" / "rank0.log").read_text()
    resumed = log.split("Resumed from the fast tier (step ")[1]
    assert (
        int(resumed.split(",")[0]) in (6, 7)
        and "newer than the shared tier's step 4): its own copy" in resumed
    )
    assert [r["step"] for r in metrics(run)] == list(range(1, STEPS + 1)), "every step logged once"
    assert_bitwise(run, reference)
    assert not paths.job_root.exists(), "the fast tier does not outlive the job's end"


# ------------------------------------------------------------------------ two "nodes" of one rank each
def _group(fn: Any, world: int, *args: Any) -> None:
    from hpctrain.launch.local import free_port
    from hpctrain.verify.local_group import start_ranks

    start_ranks(_join, world, world, free_port("127.0.0.1"), fn, args)


def _join(rank: int, world: int, port: int, fn: Any, args: tuple[Any, ...]) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch.distributed as dist

    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.rendezvous.group import init_distributed

    torch.set_num_threads(1)
    env = DistEnv.from_environ()
    device = init_distributed(env, timeout_s=60)
    fn(env, device, *args)
    dist.barrier()
    dist.destroy_process_group()


def _fit(env: Any, device: torch.device, run_dir: str, overrides: list[str], job: str) -> None:
    """One rank of a run of the real trainer, its log in logs/rank<R>.log."""
    import torch.distributed as dist

    from hpctrain.config.compose import compose, to_typed
    from hpctrain.config.io import write_run_config
    from hpctrain.config.shape import run_shape
    from hpctrain.resilience.signals import StopSignals
    from hpctrain.resilience.stop import StopCheck
    from hpctrain.resilience.watchdog import Watchdog
    from hpctrain.train.trainer import fit

    os.environ["HPCTRAIN_JOB_ID"] = job
    run = Path(run_dir)
    (run / "logs").mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=run / "logs" / f"rank{env.rank}.log", level=logging.INFO, force=True)
    composed = compose(overrides)
    if env.rank == 0:
        write_run_config(run, composed)
    dist.barrier()
    cfg = to_typed(composed)
    stop = StopCheck(StopSignals(set()), None, env.rank == 0, device)
    watchdog = Watchdog(run, env.rank, env.hostname, 0.0, 0.0, lambda culprit, why: None)
    fit(cfg, run_shape(cfg), env, device, run, None, stop, watchdog)
    watchdog.close()


def test_a_lost_node_restarts_from_the_copy_its_peer_kept_bitwise(reference: Path, tmp_path: Path) -> None:
    run, job = tmp_path / "run", f"test-{uuid.uuid4().hex[:8]}"
    args = [*RUN, *FAST_TIER, f"hydra.run.dir={run}"]
    with pytest.raises(Exception, match=r"SIGKILL|signal"):
        _group(_fit, 2, str(run), [*args, KILL], job)
    paths = layout.FastTierPaths(Path("/dev/shm"), layout.run_key(run), f"local-{job}")
    host = os.uname().nodename
    kept = [paths.own(host, 0), paths.own(host, 1), paths.held(host, 0, 1), paths.held(host, 1, 0)]
    steps = set.intersection(*({layout.step_of(c) for c in layout.copies(d)} for d in kept))
    step = max(steps)  # every rank's own copy, and the one its peer kept, of this step
    assert step >= 6, steps
    for directory in kept:  # exactly this step everywhere, so that the restart meets the damage below
        for copy in layout.copies(directory):
            if layout.step_of(copy) != step:
                shutil.rmtree(copy)
    # Rank 1's own copy is lost; rank 0's own copy has a flipped bit.
    shutil.rmtree(paths.own(host, 1))
    shard = next((paths.own(host, 0) / layout.checkpoint_name(step)).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x08
    shard.write_bytes(bytes(data))

    _group(_fit, 2, str(run), args, job)
    log0, log1 = ((run / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    damaged = f"rank 0, step {step}, not loaded: CheckpointDamaged: __0_0.distcp does not match its checksum"
    assert damaged in log0, f"{log0[-3000:]}\n----\n{log1[-3000:]}"
    resumed = (
        f"Resumed from the fast tier (step {step}, newer than the shared tier's step 4): the copy rank 1"
    )
    assert f"{resumed} kept for it" in log0
    assert f"Received the fast-tier copy of step {step} from rank 0" in log1
    assert "the copy rank 0 kept for it" in log1
    assert_bitwise(run, reference)
    assert not paths.job_root.exists()
