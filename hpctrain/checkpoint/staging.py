"""Staging for checkpoints written by the writer process: a copy of the state in one shared-memory segment.

The state is flattened the way DCP flattens it (``flatten_state_dict``: one entry per tensor or value, keyed
by its dotted name). Every tensor (a DTensor by its local shard) gets a slot in one segment of shared memory
(``torch.UntypedStorage._new_shared``: pinned with ``cudaHostRegister`` when the state is on a GPU) that the
writer process maps once; the segment and its slots are kept while the state's layout (names, shapes,
dtypes) is unchanged, so staging costs one memcpy of the state, no allocation (fresh pages fault on first
touch: many times slower) and nothing sent but a few names. Tensors sharing memory (tied weights) get one
slot. Values that are not tensors are serialised at once as DCP would (``torch.save`` of plain data: RNG
states, counters), so they are exactly the saved step's. A segment is reused only once the writer has
finished reading it: ``CheckpointManager`` waits for a pending save before staging the next.

Copied beside the next step (CheckFreq, Mohan et al., FAST '21, §4.2: the snapshot of step N may overlap the
forward and backward of step N+1 and must finish before its weight update). The parameters and the
optimizer's state change only in ``optimizer.step()``; :meth:`SegmentStager.defer_until_step` names the
optimizers whose tensors those are. Their tensors (found by storage) are then copied by a background thread
at nice 19 while training runs the next forward and backward, and a pre-hook on each optimizer's ``step``
waits for the copy: the staged state is still exactly the state of the saved step, and ``save`` blocks only
for the rest (model buffers, which a forward may change, RNG and counters: small). Only the trainer, which
owns the loop, declares optimizers: a loop that changed parameters outside ``step`` must not.

Over 400 lines: the segment's layout, its reuse while the state's layout holds, the copy beside the next step
and the plan the writer serves from it are one protocol with the writer process; split, both halves would
share the slots' invariants.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner, create_default_local_save_plan
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from hpctrain import torchapi
from hpctrain.checkpoint.direct import nice_this_thread
from hpctrain.checkpoint.state import allocate_optimizer_state

ALIGN = 4096  # slots start on a page: the writer's copies and any O_DIRECT write see aligned memory


@dataclass(frozen=True)
class Slot:
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


@dataclass
class Staged:
    """One save's staged state: tensors in ``segment`` at ``slots``, other values as ``blobs`` (DCP's
    bytes), and DCP's local save plan for it. ``layout`` names the layout (the segment and plan are reused
    while it is unchanged)."""

    layout: int
    segment: torch.Tensor
    slots: dict[str, Slot]
    blobs: dict[str, bytes]
    plan: SavePlan
    signature: str  # the state's names, local shapes and dtypes: a fast-tier copy fits only an equal one
    deferred: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    ready: Any = None  # CUDA: an event recorded when staging began, which the copy's stream waits for


def flat_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state of these Statefuls flattened as DCP flattens it: ({name: tensor or value}, mapping)."""
    return torchapi.flatten_state_dict(torchapi.stateful_to_state_dict(dict(state)))


@contextlib.contextmanager
def fresh_optimizers_kept(state: dict[str, Any]) -> Iterator[None]:
    """Leave an optimizer that has not stepped yet as it was. torch's ``get_state_dict`` gives one without
    state a step at lr 0 to create its state (``_init_optim_state``), which counts as AdamW's first step and
    changes every update after: a look at the state before training must not. The state is made without
    that step where it can be (:func:`~hpctrain.checkpoint.state.allocate_optimizer_state`)."""
    fresh = fresh_optimizers(state)
    for optimizer in fresh:
        allocate_optimizer_state(optimizer)
    try:
        yield
    finally:
        for optimizer in fresh:
            optimizer.state.clear()


def fresh_optimizers(state: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """The optimizers of these Statefuls that have no state yet (they have not stepped)."""
    return [
        optimizer
        for stateful in state.values()
        if isinstance(optimizer := getattr(stateful, "optimizer", None), torch.optim.Optimizer)
        and not optimizer.state
    ]


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of this rank's tensors in these Statefuls (its local shards; tied tensors once)."""
    with fresh_optimizers_kept(state):
        flat, _ = flat_state(state)
    seen: set[tuple[int, int]] = set()
    total = 0
    for value in flat.values():
        local = _local(value)
        if local is not None and (_storage(local), local.storage_offset()) not in seen:
            seen.add((_storage(local), local.storage_offset()))
            total += local.numel() * local.element_size()
    return total


def plan_signature(plan: SavePlan) -> str:
    """A digest of what a rank saves: every entry's name and, for a tensor, its global shape, dtype and the
    offsets and shape of this rank's piece. A fast-tier copy is loaded only into a state of the same."""
    parts = []
    for item in plan.items:
        data = item.tensor_data
        shape = None
        if data is not None:
            shape = (
                tuple(data.size),
                str(data.properties.dtype),
                tuple(data.chunk.offsets),
                tuple(data.chunk.sizes),
            )
        parts.append((item.index.fqn, item.type.name, shape))
    return hashlib.sha256(repr(sorted(parts, key=repr)).encode()).hexdigest()[:16]


def state_signature(state: dict[str, Any]) -> str:
    """:func:`plan_signature` of these Statefuls as they are now."""
    with fresh_optimizers_kept(state):
        flat, _ = flat_state(state)
        return plan_signature(create_default_local_save_plan(flat, True))


class SegmentStager:
    def __init__(self) -> None:
        self._segment: torch.Tensor | None = None
        self._layout_key: tuple[Any, ...] | None = None
        self._layout = 0
        self._slots: dict[str, Slot] = {}
        self._plans: dict[bool, SavePlan] = {}
        self._signature = ""
        self._pinned = False
        self._optimizers: list[torch.optim.Optimizer] = []
        self._hooks: list[RemovableHandle] = []
        self._copying: Future[Staged] | None = None
        self._encodings: dict[tuple[str, str], bytes] = {}
        self._copier: _Copier | None = None

    def defer_until_step(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Copy these optimizers' parameters and state beside the next step (see the module docstring)."""
        for optimizer in optimizers:
            if all(optimizer is not known for known in self._optimizers):
                self._optimizers.append(optimizer)
                self._hooks.append(optimizer.register_step_pre_hook(self._before_step))

    def stage(
        self,
        state: dict[str, Any],
        is_coordinator: bool,
        then: Callable[[Staged | None, BaseException | None], None],
    ) -> Staged:
        """Copy ``state`` (Statefuls) into the segment. Tensors the optimizers own are copied by a thread
        beside the next step; ``then(staged, error)`` is called once everything is copied (from that thread,
        or at once when nothing was deferred)."""
        self.wait_staged()
        flat, mapping = flat_state(state)
        deferrable = self._optimizer_storages()
        staged = self._layout_for(flat, mapping, is_coordinator)
        blobs: dict[str, bytes] = {}
        copied: set[int] = set()  # slots already copied (tied weights share one)
        with torch.no_grad():
            for name, value in flat.items():
                local = _local(value)
                if local is None:
                    blobs[name] = self._encoded(value)
                    continue
                slot = self._slots[name]
                if slot.offset in copied:
                    continue
                copied.add(slot.offset)
                if _storage(local) in deferrable:
                    staged.deferred.append((self._view(slot), local))
                else:
                    self._view(slot).copy_(local)
        if any(source.device.type == "cuda" for _, source in staged.deferred):
            # The copy's stream starts after the work queued so far (this step's optimizer step).
            staged.ready = torch.cuda.Event()
            staged.ready.record()
        staged.blobs = blobs
        if not staged.deferred:
            then(staged, None)
            return staged
        done: Future[Staged] = Future()
        self._copying = done
        if self._copier is None:  # one thread for every save: starting one costs ms on a busy machine
            self._copier = _Copier()
        self._copier.jobs.put((staged, done, then))
        return staged

    def _encoded(self, value: Any) -> bytes:
        return encode_value(value, self._encodings)

    def wait_staged(self) -> None:
        """Return once every tensor of the last save is copied (re-raises the copy's failure)."""
        copying, self._copying = self._copying, None
        if copying is not None:
            copying.result()

    def wait_staged_quietly(self) -> None:
        """Return once the last copy is over, whatever became of it (its failure is reported elsewhere)."""
        copying, self._copying = self._copying, None
        if copying is not None:
            copying.exception()

    def close(self) -> None:
        self.wait_staged()
        if self._copier is not None:
            self._copier.jobs.put(None)
            self._copier = None
        self._segment = None
        self._layout_key = None
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._optimizers = [], []

    def _before_step(self, *_: Any) -> None:
        self.wait_staged()

    def _optimizer_storages(self) -> set[int]:
        found: set[int] = set()
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                found.update(_storage(p) for p in group["params"])
            for per_param in optimizer.state.values():
                found.update(_storage(v) for v in per_param.values() if isinstance(v, torch.Tensor))
        found.discard(0)
        return found

    def _view(self, slot: Slot) -> torch.Tensor:
        assert self._segment is not None
        return self._segment[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)

    def _layout_for(self, flat: dict[str, Any], mapping: dict[str, Any], is_coordinator: bool) -> Staged:
        """The segment, slots and plan of this layout: kept from the last save when it is the same."""
        shapes: list[tuple[Any, ...]] = []
        views: dict[tuple[Any, ...], str] = {}
        aliases: dict[str, str] = {}
        cuda = False
        for name, value in flat.items():
            local = _local(value)
            if local is None:
                shapes.append((name, None))
                continue
            cuda = cuda or local.device.type == "cuda"
            view = (_storage(local), local.storage_offset(), tuple(local.shape), local.stride(), local.dtype)
            if _storage(local) != 0 and view in views:
                aliases[name] = views[view]  # tied: one slot for both names
            else:
                views[view] = name
            shapes.append(
                (name, tuple(local.shape), local.dtype, aliases.get(name), isinstance(value, DTensor))
            )
        key = tuple(shapes)
        if key != self._layout_key or self._segment is None:
            offset, slots = 0, {}
            for entry in shapes:
                name = entry[0]
                if entry[1] is None:
                    continue
                if entry[3] is not None:
                    slots[name] = slots[entry[3]]
                    continue
                slot = Slot(offset, entry[1], entry[2])
                slots[name] = slot
                offset += -(-max(slot.nbytes, 1) // ALIGN) * ALIGN
            storage = torchapi.new_shared_storage(max(offset, 1))
            self._segment = torch.empty(0, dtype=torch.uint8).set_(storage)
            self._pinned = False
            self._slots = slots
            self._layout_key = key
            self._layout += 1
            self._plans = {}
        if not self._pinned and cuda:
            torchapi.pin_host_memory(self._segment.data_ptr(), self._segment.numel())  # cudaHostRegister
            self._pinned = True
        if is_coordinator not in self._plans:
            plan = create_default_local_save_plan(flat, is_coordinator)
            self._plans[is_coordinator] = SavePlan(plan.items, planner_data=mapping)
            self._signature = plan_signature(plan)
        return Staged(
            self._layout, self._segment, dict(self._slots), {}, self._plans[is_coordinator], self._signature
        )


def encode_value(value: Any, cache: dict[tuple[str, str], bytes]) -> bytes:
    """DCP's own encoding of a value (``torch.save``, read back weights-only). A flattened optimizer state
    repeats each option per parameter (2,161 values for GPT-2 small, 0.2-0.29 s of torch.save here): plain
    values are encoded once per distinct value (``cache``, emptied when it grows past a few thousand: a
    learning rate is another value every step)."""
    key = _plain_key(value)
    if key is not None and key in cache:
        return cache[key]
    buffer = io.BytesIO()
    torch.save(value, buffer)
    if key is not None:
        if len(cache) > 4096:
            cache.clear()
        cache[key] = buffer.getvalue()
    return buffer.getvalue()


class EncodingSavePlanner(DefaultSavePlanner):
    """DCP's default save planner (for a save written by the training process itself), its values encoded
    by :func:`encode_value` and its plans cached by DCP from one save to the next while they are unchanged
    (``enable_plan_caching``: no global planning then)."""

    _cache: dict[tuple[str, str], bytes] = {}  # noqa: RUF012 - shared by every save of the process, on purpose

    def __init__(self) -> None:
        super().__init__(enable_plan_caching=True)

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(encode_value(object, EncodingSavePlanner._cache))
        return super().transform_object(write_item, object)


_PLAIN = (bool, int, float, str, type(None))


def _plain_key(value: Any) -> tuple[str, str] | None:
    """A key naming a plain value exactly (``repr`` round-trips floats), or None for anything else."""
    if isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
        return type(value).__name__, repr(value)
    return None


def _local(value: Any) -> torch.Tensor | None:
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, torch.Tensor):
        return value
    return None


def _storage(tensor: torch.Tensor) -> int:
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.untyped_storage().data_ptr()


class _Copier:
    """The thread that copies beside the next step (a thread of its own: it lowers its own priority)."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Staged, Future[Staged], Callable[..., None]] | None] = queue.Queue()
        threading.Thread(target=self._run, name="hpctrain-stage", daemon=True).start()

    def _run(self) -> None:
        nice_this_thread()
        while (job := self.jobs.get()) is not None:
            _copy_all(*job)


def _copy_all(
    staged: Staged, done: Future[Staged], then: Callable[[Staged | None, BaseException | None], None]
) -> None:
    try:
        with torch.no_grad():
            stream = torch.cuda.Stream() if staged.ready is not None else None
            if stream is not None:
                stream.wait_event(staged.ready)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                for buffer, source in staged.deferred:
                    buffer.copy_(source, non_blocking=source.device.type == "cuda")
            if stream is not None:
                stream.synchronize()
        staged.deferred = []
    except BaseException as err:
        try:
            then(None, err)
        finally:
            done.set_exception(err)
    else:
        try:
            then(staged, None)  # before the step waiting for the copy goes on: the request is out
        finally:
            done.set_result(staged)
