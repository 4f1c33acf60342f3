"""The checkpoint writer: one process per rank that serialises, checksums and writes what training staged.

Why a process: written by a thread, a save's CPU (serialising each tensor, the checksum, the writes) ran in
the training process and cost 38-61% of a synchronous save in slower steps (the GIL and the cores). Here the
training process only copies its state into a shared-memory segment (``hpctrain.checkpoint.staging``) and
sends a few names; the writer, started once at nice 19 (every thread of it: the cores go to training first),
maps the segment and writes with ``hpctrain.checkpoint.direct`` (raw tensors, ``O_DIRECT``, CRC-32C as
written).

Composed with DCP as its process-based async save is (``torch.distributed.checkpoint`` with
``AsyncCheckpointerType.PROCESS`` starts one process per rank, joins them in a gloo group of their own and
runs ``dcp.save`` there): the writers join a gloo group over a store that training rank 0 serves, and each
save is DCP's own ``save`` (its planning, de-duplication of replicated tensors across ranks, ``.metadata``)
with a planner that serves the staged tensors (:class:`StagedPlanner`: the local plan computed in the
training process, where the DTensors are). Not DCP's executor itself: it keeps one module-wide process that
cannot be replaced once it died (every later save fails), does not die with the training process, and sends
the whole staged state through a pipe every save. Here a writer dies with its training process (the kernel's
parent-death signal), the manager notices a dead writer at the next step on every rank (a one-integer
all-reduce while a save is pending), never commits its checkpoint, and starts a new generation of writers.

Besides the shared checkpoint, a request may ask for a copy in the fast tier (``hpctrain.checkpoint.fast``):
the writer saves its rank's state into node-local memory and exchanges it with the writer of the peer rank
(the same local rank on the next node) over the writers' group.
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType

from hpctrain.checkpoint import replica
from hpctrain.checkpoint.direct import nice_this_thread
from hpctrain.checkpoint.staging import Slot
from hpctrain.checkpoint.tiers import storage_writer
from hpctrain.errors import underlying
from hpctrain.faults import FaultInjector, FaultsConfig
from hpctrain.rundir.objects import Store

log = logging.getLogger(__name__)

NICE = 19
READY_TIMEOUT_S = 300.0  # a writer that is not up by then (imports, the group's rendezvous) failed


@dataclass(frozen=True)
class WriterSetup:
    rank: int
    world_size: int
    store: tuple[str, int] | None  # the store the writers' group meets through; None: one rank, no group
    prefix: str  # this generation's keys in that store
    timeout_s: float
    faults: FaultsConfig | None = None


@dataclass
class SaveRequest:
    id: int
    step: int
    layout: int  # the segment and plan of this layout; sent only when the writer does not have them yet
    slots: dict[str, Slot]
    blobs: dict[str, bytes]
    plan: SavePlan | None = None
    segment: torch.Tensor | None = None
    shared: str | None = None  # write DCP's shards here (a .tmp- directory the trainer commits, or a URL)
    store: Store | None = None  # the object store, for a URL (its options and timeout)
    local: replica.LocalSave | None = None  # and/or a copy into the fast tier
    extra: dict[str, Any] = field(default_factory=dict)


class StagedPlanner(DefaultSavePlanner):
    """DCP's default save planner, whose local plan and data come from the staged segment: global planning,
    de-duplication and metadata are DCP's own."""

    def __init__(self, plan: SavePlan, buffers: dict[str, torch.Tensor], blobs: dict[str, bytes]) -> None:
        super().__init__()
        self._local_plan = plan
        self._buffers = buffers
        self._blobs = blobs

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        self.state_dict = {}
        self.mappings = dict(self._local_plan.planner_data or {})
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        self.plan = self._local_plan
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        fqn = write_item.index.fqn
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(self._blobs[fqn])
        return self._buffers[fqn]


class Writer:
    """The training process's handle on its writer process."""

    def __init__(self, setup: WriterSetup) -> None:
        import torch.multiprocessing  # noqa: F401 - registers the reductions that send tensors by handle

        context = multiprocessing.get_context("spawn")
        self.setup = setup
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=_main, args=(child, setup, os.getpid()), daemon=True, name=f"hpctrain-writer-{setup.rank}"
        )
        _start_at_low_priority(self.process)
        child.close()
        self._lock = threading.Lock()  # receiving
        self._ready = False
        self._outcomes: dict[int, str | None] = {}  # request id → None (done) or why it failed
        self._lost: str | None = None
        # Requests go out through a thread of their own: a send blocks while the writer is still booting and
        # its pipe is full, and neither training nor the manager's poll may wait for that.
        self._outbox: queue.Queue[tuple[str, SaveRequest] | None] = queue.Queue()
        self._sender = threading.Thread(target=self._send_all, name="hpctrain-writer-send", daemon=True)
        self._sender.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the writer has started and joined its group (raises when it could not)."""
        deadline = time.monotonic() + timeout_s
        while not self._ready:
            self._receive(timeout=0.05)
            if self._lost is not None:
                raise RuntimeError(f"checkpoint writer of rank {self.setup.rank} did not start: {self._lost}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"checkpoint writer of rank {self.setup.rank} not up after {timeout_s:.0f} s"
                )

    def submit(self, request: SaveRequest) -> None:
        self._outbox.put(("save", request))

    def _send_all(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError) as err:  # the writer is gone: the outcome says so
                self._lost = self._lost or f"could not send it the save: {err}"
                return
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(None)  # asks the writer to finish and exit

    def outcome(self, request_id: int) -> tuple[bool, str | None]:
        """(finished, why it failed or None) of a submitted request; a dead writer fails it."""
        self._receive(timeout=0)
        if request_id in self._outcomes:
            return True, self._outcomes[request_id]
        if self._lost is not None:
            return True, self._lost
        if self.process.exitcode is not None:
            self._receive(timeout=0)  # a result it sent before it died
            if request_id in self._outcomes:
                return True, self._outcomes[request_id]
            self._lost = f"the writer process died ({_exit_text(self.process.exitcode)})"
            return True, self._lost
        return False, None

    def _receive(self, timeout: float) -> None:
        with self._lock:
            try:
                while self._conn.poll(timeout):
                    message = self._conn.recv()
                    timeout = 0
                    if message[0] == "ready":
                        self._ready = True
                    elif message[0] == "done":
                        self._outcomes[message[1]] = None
                    elif message[0] == "failed":
                        self._outcomes[message[1]] = message[2]
                    elif message[0] == "start failed":
                        self._lost = message[1]
            except (EOFError, OSError):
                if self._lost is None:
                    self.process.join(timeout=1)
                    self._lost = f"the writer process died ({_exit_text(self.process.exitcode)})"

    def stop(self, grace_s: float = 10.0) -> None:
        """Ask the writer to finish and exit; kill it if it does not."""
        self._outbox.put(None)
        self._sender.join(timeout=grace_s)
        self.process.join(timeout=grace_s)
        self.kill()

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
        self._outbox.put(None)
        self._conn.close()


def describe(err: BaseException) -> str:
    """One line for an error; DCP's CheckpointException by the first rank's own error inside it."""
    err = underlying(err)
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


# ------------------------------------------------------------------------------------------ the process
def _main(conn: Connection, setup: WriterSetup, parent: int) -> None:
    _die_with_parent(parent)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # this thread; threads started later inherit it
    torch.set_num_threads(1)
    # A fast-tier copy is a save of one rank by design: DCP's note that no group is used is noise here.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    faults = FaultInjector(setup.faults, setup.rank)
    try:
        if setup.store is not None:
            host, port = setup.store
            store = dist.TCPStore(host, port, is_master=False, timeout=_seconds(setup.timeout_s))
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(setup.prefix, store),
                rank=setup.rank,
                world_size=setup.world_size,
                timeout=_seconds(setup.timeout_s),
            )
    except BaseException as err:
        with contextlib.suppress(OSError):
            conn.send(("start failed", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready",))
    segments: dict[int, torch.Tensor] = {}
    plans: dict[int, SavePlan] = {}
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the training process is gone
                return
            if message is None:
                return
            request: SaveRequest = message[1]
            try:
                _save(request, segments, plans, setup, faults)
            except BaseException as err:
                conn.send(("failed", request.id, describe(err)))
            else:
                conn.send(("done", request.id))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _save(
    request: SaveRequest,
    segments: dict[int, torch.Tensor],
    plans: dict[int, SavePlan],
    setup: WriterSetup,
    faults: FaultInjector,
) -> None:
    if request.segment is not None:
        segments.clear()
        segments[request.layout] = request.segment
    if request.plan is not None:
        plans.clear()
        plans[request.layout] = request.plan
    segment, plan = segments[request.layout], plans[request.layout]
    buffers = {
        name: segment[s.offset : s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
        for name, s in request.slots.items()
    }

    def progress(_: int) -> None:
        faults.at("write", request.step)

    if request.local is not None:
        # First: the fast tier is in memory, and a restart wants it soonest.
        replica.save_local(request.local, request.step, StagedPlanner(plan, buffers, request.blobs), progress)
    if request.shared is not None:
        writer = storage_writer(request.shared, request.store, background=True, progress=progress)
        planner = StagedPlanner(plan, buffers, request.blobs)
        dcp.save({}, storage_writer=writer, planner=planner, no_dist=setup.store is None)


def _start_at_low_priority(process: multiprocessing.process.BaseProcess) -> None:
    """Start ``process`` at nice 19 from its first instruction: from a thread that lowers its own priority
    first (Linux keeps a nice value per thread, and a child inherits its forking thread's). The writer sets it
    again itself, but only once its interpreter has imported torch: that boot (~1.5 s of CPU) ran at the
    training's priority and slowed the ranks beside it unevenly. Lowering the training thread's own priority
    for the fork is not an option: an unprivileged process may not raise it back."""
    failed: list[BaseException] = []

    def start() -> None:
        try:
            nice_this_thread()
            process.start()
        except BaseException as err:  # re-raised in the caller's thread
            failed.append(err)

    starter = threading.Thread(target=start, name="hpctrain-writer-start")
    starter.start()
    starter.join()
    if failed:
        raise failed[0]


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the training process that started it dies (Linux ``PR_SET_PDEATHSIG``): a
    writer left behind would go on writing into a run directory that a restart is cleaning up."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)


def _seconds(value: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=value)


def store_for_writers(
    group: dist.ProcessGroup | None, host: str
) -> tuple[dist.TCPStore | None, tuple[str, int]]:
    """A store for the writers' group, served by training rank 0 on a free port (collective over ``group``:
    every rank gets its address). The store object is kept alive by rank 0's manager."""
    server = None
    if dist.get_rank() == 0:
        server = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        address = [(host, server.port)]
    else:
        address = [None]
    dist.broadcast_object_list(address, src=0, group=group)
    assert address[0] is not None
    return server, (str(address[0][0]), int(address[0][1]))
