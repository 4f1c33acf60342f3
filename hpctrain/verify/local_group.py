"""Run one function on N processes of this machine, joined into one process group over loopback.

For the tools that run many configurations inside one group of processes (``hpctrain.verify.parity``,
``hpctrain.verify.plan_measure``, ``bench/parallel.py``): :func:`run_local_group`. Training runs go through
``hpctrain.launch.local``.

:func:`start_ranks` is ``torch.multiprocessing.spawn`` for the tests that start ranks of their own: where a
persistent fork server runs (``HPCTRAIN_FORKSERVER``: a workstation's, the test suite's), the ranks are
forked from it, as a launch's workers are, instead of each importing torch again (~3 CPU-s a rank; measured
over the six test files that use it: 214 → 181 CPU-s). ``python -m hpctrain.verify.local_group CALL RANK``
is such a rank. (The tables' groups stay on multiprocessing's fork server, which preloads the caller's
module: forked from the persistent server instead, the parity and plan tables cost the same, 291 vs 304
CPU-s.)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
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


class RankFailed(RuntimeError):
    """A rank forked from the persistent server exited non-zero (its traceback is on stderr)."""


def start_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """``fn(rank, *args)`` on ``world`` processes, as ``torch.multiprocessing.spawn`` runs it: forked from
    the persistent server where one runs, else spawned. ``args``: plain data (JSON) and module-level
    functions. Returns when all are done; raises when one failed."""
    if not _forked(fn, world, args):
        import torch.multiprocessing as mp

        mp.start_processes(fn, args=args, nprocs=world, start_method="spawn")


def _forked(fn: Callable[..., None], world: int, args: tuple[Any, ...]) -> bool:
    """``fn(rank, *args)`` on ``world`` children of the persistent fork server; False when none serves
    (the caller starts the processes itself)."""
    from hpctrain.launch.forked import persistent_server

    server = persistent_server()
    if server is None:
        return False
    try:
        with tempfile.TemporaryDirectory(prefix="hpctrain-group-") as tmp:
            # The call as plain data (functions by name; nothing is unpickled), in a 0700 directory.
            call = Path(tmp) / "call.json"
            call.write_text(json.dumps(_plain([fn, list(args)])))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(_import_roots(fn))}
            # Their output goes where this process's stderr goes (file descriptor 2: pytest's capture too).
            ranks = [server.spawn(__name__, [str(call), str(rank)], env, 2) for rank in range(world)]
            failed = _wait_all(ranks)
    finally:
        server.close()  # kills what is left of its children
    if failed is not None:
        rank, status = failed
        how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        raise RankFailed(f"rank {rank} of {world} ended with {how} (its traceback is above)")
    return True


def _wait_all(ranks: list[Any]) -> tuple[int, int] | None:
    """Wait for every rank; at the first that fails, kill the others (they would wait on it until the
    group's timeout) and return (its rank, its status)."""
    import time

    while True:
        statuses = [r.poll() for r in ranks]
        bad = next(((i, s) for i, s in enumerate(statuses) if s not in (None, 0)), None)
        if bad is not None:
            for r, s in zip(ranks, statuses, strict=True):
                if s is None:
                    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                        os.killpg(r.pid, signal.SIGKILL)  # each child leads its own session
            return bad  # type: ignore[return-value]
        if all(s == 0 for s in statuses):
            return None
        time.sleep(0.05)


def _import_roots(fn: Callable[..., None]) -> list[str]:
    """sys.path entries a fresh interpreter needs to import ``fn`` by name: the directory above its
    package (a test module's ``tests.e2e...`` under the checkout), then the caller's PYTHONPATH."""
    module = sys.modules[fn.__module__]
    root = Path(module.__file__ or ".").resolve().parent
    for _ in range(fn.__module__.count(".")):
        root = root.parent
    return [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]


def _plain(value: Any) -> Any:
    """``value`` as JSON data: a module-level function as ``{"function": "module:qualname"}``, tuples as
    lists; TypeError for anything else that JSON cannot hold."""
    if callable(value) and hasattr(value, "__qualname__") and "<locals>" not in value.__qualname__:
        return {"function": f"{value.__module__}:{value.__qualname__}"}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"start_ranks passes plain data and module-level functions, not {type(value).__name__}")


def _unplain(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"function"}:
        module, _, qualname = value["function"].partition(":")
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    if isinstance(value, dict):
        return {k: _unplain(v) for k, v in value.items()}
    return value


def _rank_main(argv: list[str]) -> None:
    call, rank = argv
    fn, args = _unplain(json.loads(Path(call).read_text()))
    fn(int(rank), *args)


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
