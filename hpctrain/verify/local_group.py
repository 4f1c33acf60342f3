"""Run one function on N processes of this machine, joined into one process group over loopback.

For the tools that run many configurations inside one group of processes (``hpctrain.verify.parity``,
``hpctrain.verify.plan_measure``, ``bench/parallel.py``). Training runs go through ``hpctrain.launch.local``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from hpctrain.rendezvous.env import DistEnv


def _preload() -> tuple[str, ...]:
    """What a rank imports on its way through ``fn`` (the trainer's stack; torch.distributed's modules;
    dynamo, which the optimizer's first use imports): imported once in the server rather than by each forked
    rank (~1.5 CPU-s each; a parity table forks 15)."""
    from hpctrain.torchapi import DYNAMO_MODULE

    return ("torch.distributed", DYNAMO_MODULE, "hpctrain.train.trainer", "hpctrain.config.compose")


def run_local_group(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Start ``world`` processes; each joins the group and calls ``fn(env, device, *args)``. Returns when all
    are done; raises torch's ProcessRaisedException when one failed. ``fn`` must be importable by name (a
    module-level function), as the processes are started by multiprocessing's fork server."""
    import multiprocessing

    import torch.multiprocessing as mp

    from hpctrain.launch.local import free_port

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Forked from one server that imported torch and fn's module once (multiprocessing's forkserver), not
    # spawned: a spawned rank imports torch again (~2-3 s of CPU each; a parity table starts 15 of them).
    # The server is a clean process started for this (no threads, no process group), so forking it is safe.
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__, fn.__module__, *_preload()])
    mp.start_processes(
        _join_and_run, args=(world, free_port("127.0.0.1"), fn, args), nprocs=world, start_method="forkserver"
    )


def _join_and_run(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.rendezvous.group import init_distributed

    torch.set_num_threads(1)  # the ranks share this machine's cores: one each, as one GPU each
    env: DistEnv = DistEnv.from_environ()
    device: torch.device = init_distributed(env, timeout_s=120)
    fn(env, device, *args)
    # Every rank done before any group is torn down, and torn down before the interpreter finalises: gloo's
    # worker threads still holding work at exit abort the process ("terminate called without an active
    # exception"; pytorch/pytorch#179291): the plan measurement's rank 0 did so once in CI (2026-11-25).
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
