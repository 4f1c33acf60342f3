"""Ranks started by srun agree on a rendezvous port without talking, and move on together when it is taken
(hpctrain.rendezvous.group; the port of a job: tests/unit/slurm/test_spec.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.rendezvous.env import DistEnv
from hpctrain.rendezvous.group import PORT_ATTEMPTS, init_distributed
from hpctrain.rundir import RunDir
from hpctrain.slurm.spec import rendezvous_port
from hpctrain.verify.local_group import start_ranks

JOB = {"SLURM_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "", "SLURM_RESTART_COUNT": "1"}


def _rank(rank: int, run_dir: str, out: str) -> None:
    environ = {
        **JOB,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
    }
    env = DistEnv.from_environ(environ)
    init_distributed(env, timeout_s=30, run_dir=RunDir(Path(run_dir)))
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    Path(out, f"rank{rank}").write_text(str(float(value)))
    dist.destroy_process_group()


def test_a_taken_port_moves_every_rank_to_the_next_candidate(tmp_path: Path) -> None:
    key = (JOB["SLURM_JOB_ID"], JOB["SLURM_ARRAY_TASK_ID"], JOB["SLURM_RESTART_COUNT"])
    first = rendezvous_port(*key)
    squatter = socket.socket()  # another job's store on this node
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("0.0.0.0", first))
    squatter.listen()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A record of an earlier start of the same job must not be read as this start's.
    RunDir(run_dir).write_rendezvous({"job": "4242::0", "host": "localhost", "port": first})
    try:
        os.environ.pop("MASTER_PORT", None)
        start_ranks(_rank, 2, str(run_dir), str(tmp_path))
    finally:
        squatter.close()
    assert [Path(tmp_path, f"rank{r}").read_text() for r in (0, 1)] == ["3.0", "3.0"]
    record = RunDir(run_dir).read_rendezvous()
    # The next free candidate: attempt 1's, unless another process on this machine holds that one too (an
    # ephemeral port of a test beside it: CI saw 36177 taken once), then a later one; never the squatted one.
    later = [rendezvous_port(*key, attempt=a) for a in range(1, PORT_ATTEMPTS)]
    assert record is not None and record["port"] in later and record["port"] != first, record
