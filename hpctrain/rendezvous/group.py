"""Who am I, who are my peers: read the launcher's environment and join torch.distributed.

The local launcher and torchrun export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; a task started by srun (submitit, or an sbatch template) has SLURM_PROCID & co instead, from
which :func:`hpctrain.rendezvous.env.task_from_environ` derives the same (first node, port from the job id,
array task and restart count). Such a port can be taken (another job on the node, a predecessor's socket in
TIME_WAIT): rank 0 then moves on to the next candidate and writes the one it listens on into the run
directory (rendezvous.json, keyed by the job start), where the other ranks read it.
The process group uses NCCL with one GPU per local rank when CUDA is present, gloo otherwise, and a
timeout, so that a peer that never arrives (or dies) fails the run instead of hanging it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from hpctrain.rendezvous.env import DistEnv
from hpctrain.rundir import RunDir
from hpctrain.slurm.spec import rendezvous_port

log = logging.getLogger(__name__)


PORT_ATTEMPTS = 8


def init_distributed(env: DistEnv, timeout_s: float, run_dir: RunDir | None = None) -> torch.device:
    """Join the process group; return this rank's device. With ``run_dir``, ranks started by srun agree on
    a free port through it (:func:`slurm_store`)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device, backend = device_for(env.local_rank, gpus)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    check_device(device, env.hostname)  # before the rendezvous: a bad device never joins
    if backend == "nccl" and run_dir is not None:
        arm_flight_recorder(run_dir)
    port = env.master_port
    try:
        if env.port_key is not None and run_dir is not None:
            store, port = slurm_store(env, run_dir, timeout_s)
            where: dict[str, object] = {"store": store}
        elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent hosts the store and keeps it across its restarts (--max-restarts): a prefix per
            # restart keeps a restarted group off the addresses the one before left there.
            client = dist.TCPStore(
                env.master_addr,
                env.master_port,
                env.world_size,
                is_master=False,
                timeout=timedelta(seconds=timeout_s),
            )
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            where = {"store": dist.PrefixStore(f"hpctrain/restart_{restart}", client)}
        else:
            where = {"init_method": f"tcp://{env.master_addr}:{env.master_port}"}
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
            **where,  # type: ignore[arg-type]
        )
    except Exception as err:
        raise RuntimeError(
            f"rank {env.rank} on {env.hostname} could not join the {env.world_size}-rank process "
            f"group at {env.master_addr}:{port} ({backend}, timeout {timeout_s} s): "
            f"{err}"
        ) from err
    return device


# The NCCL flight recorder (PyTorch's "Flight Recorder" for NCCL): each rank keeps its last collectives in a
# ring, and dumps them when one times out, under the run directory; a hang hpctrain's watchdog declares dumps
# them beside its stacks (hpctrain.resilience.stacks.dump_flight_record). A value the user set wins.
FLIGHT_RECORDER = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # collectives kept per rank: on
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
FLIGHT_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # newer name, older name


def arm_flight_recorder(run_dir: RunDir) -> None:
    """Before an NCCL process group starts: its flight recorder on, dumping into ``flight/rank<R>``."""
    with contextlib.suppress(OSError):
        run_dir.flight.mkdir(parents=True, exist_ok=True)
    for name, value in FLIGHT_RECORDER.items():
        os.environ.setdefault(name, value)
    for name in FLIGHT_PREFIX_ENV:
        os.environ.setdefault(name, str(run_dir.flight / "rank"))


class NodeUnhealthy(RuntimeError):
    """This node failed its health check: its restart agent has it excluded (hpctrain.launch.agent)."""


def check_device(device: torch.device, host: str) -> None:
    """The device answers a tiny computation correctly (a 2×2 matrix times a vector, exact in any float)."""
    try:
        a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
        answer = (a @ torch.ones(2, 1, device=device)).flatten().tolist()
    except Exception as err:
        raise NodeUnhealthy(f"health check: {device} on {host} failed a 2x2 matmul: {err}") from err
    if answer != [3.0, 7.0]:
        raise NodeUnhealthy(f"health check: {device} on {host} computed {answer} for [3.0, 7.0]")


def device_for(local_rank: int, gpus: int) -> tuple[torch.device, str]:
    """This rank's device and process-group backend on a node with ``gpus`` visible GPUs: GPU
    ``local_rank`` and NCCL (one GPU per local rank, as torchrun and srun's tasks are laid out), else the CPU
    and gloo."""
    if gpus == 0:
        return torch.device("cpu"), "gloo"
    if local_rank >= gpus:
        raise RuntimeError(
            f"local rank {local_rank} has no GPU: this node has {gpus} "
            "(run at most that many processes per node)"
        )
    return torch.device("cuda", local_rank), "nccl"


def slurm_store(env: DistEnv, run_dir: RunDir, timeout_s: float) -> tuple[dist.TCPStore, int]:
    """The rendezvous store of a job start begun by srun, and its port.

    Rank 0 listens on the first free port of the start's candidates and records it; the others wait (at
    most ``timeout_s``) for the record of this very start, then connect.
    """
    assert env.port_key is not None
    key = ":".join(env.port_key)
    timeout = timedelta(seconds=timeout_s)
    if env.is_main:
        for attempt in range(PORT_ATTEMPTS):
            port = rendezvous_port(*env.port_key, attempt=attempt)
            try:
                store = dist.TCPStore(
                    env.master_addr,
                    port,
                    env.world_size,
                    is_master=True,
                    timeout=timeout,
                    wait_for_workers=False,
                )
            except (RuntimeError, OSError) as err:
                if "in use" not in str(err).lower():
                    raise
                log.info("Rendezvous port %d is taken; trying the next candidate", port)
                continue
            run_dir.write_rendezvous({"job": key, "host": env.master_addr, "port": port})
            return store, port
        raise RuntimeError(f"no free rendezvous port among {PORT_ATTEMPTS} candidates on {env.master_addr}")
    deadline = time.monotonic() + timeout_s
    while (record := run_dir.read_rendezvous()) is None or record.get("job") != key:
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 did not publish its rendezvous port in {run_dir.rendezvous}")
        time.sleep(0.2)
    port = int(record["port"])
    return dist.TCPStore(env.master_addr, port, env.world_size, is_master=False, timeout=timeout), port


def record_topology(env: DistEnv, run_dir: RunDir) -> list[dict[str, object]]:
    """Gather every rank's host and pid; rank 0 writes them to ranks.json for people and tools."""
    me = {"rank": env.rank, "local_rank": env.local_rank, "host": env.hostname, "pid": os.getpid()}
    everyone: list[dict[str, object]] = [{} for _ in range(env.world_size)]
    dist.all_gather_object(everyone, me)
    if env.is_main:
        run_dir.write_ranks(everyone)
    return everyone
