"""Staging for asynchronous checkpoints: a copy of the state that training may change right after ``save``.

Every tensor is copied into a CPU buffer (pinned with CUDA) that is kept, per key, for the next save, so
staging costs one memcpy of the state and no allocation (fresh buffers page-fault on first touch: many
times slower). DCP's own stager caches by storage weak reference, which is lost whenever the storage's
Python wrapper is collected. A buffer is reused only once the write that read it has finished:
``CheckpointManager`` waits for a pending save before staging the next. Tensors that share memory (tied
weights) are staged once; DTensors are staged by their local shard; other tensor subclasses and unknown
objects are deep-copied.

Copied beside the next step (CheckFreq, Mohan et al., FAST '21, §4.2: the snapshot of step N may overlap the
forward and backward of step N+1 and must finish before its weight update). The parameters and the
optimizer's state change only in ``optimizer.step()``; :meth:`BufferStager.defer_until_step` names the
optimizers whose tensors those are. Their tensors (found by storage) are then copied by a background thread
while training runs the next forward and backward, and a pre-hook on each optimizer's ``step`` waits for the
copy: the staged state is still exactly the state of the saved step, and ``save`` blocks only for the
rest (model buffers, which a forward may change, RNG and counters: small). Only the trainer, which owns the
loop, declares optimizers: a loop that changed parameters outside ``step`` must not.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

NICE = 19  # the copy takes the cores training leaves idle; step() waiting for it gives it the rest


class BufferStager(AsyncStager):
    _synchronize_after_execute = False  # the caller's synchronisation point: the optimizers' step pre-hook

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._deferrable: set[int] = set()
        self._optimizers: list[torch.optim.Optimizer] = []
        self._hooks: list[RemovableHandle] = []
        self._copying: Future | None = None

    def defer_until_step(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Copy these optimizers' parameters and state beside the next step (see the module docstring)."""
        for optimizer in optimizers:
            if all(optimizer is not known for known in self._optimizers):
                self._optimizers.append(optimizer)
                self._hooks.append(optimizer.register_step_pre_hook(self._before_step))

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | Future:
        self.wait_staged()
        self._deferrable = self._optimizer_storages()
        used: dict[str, torch.Tensor] = {}
        later: list[tuple[torch.Tensor, torch.Tensor]] = []
        staged = self._copy(state_dict, "", used, {}, later)
        self._buffers = used  # buffers of keys that are gone are freed
        if not later:
            return staged
        done: Future = Future()
        self._copying = done
        threading.Thread(target=_copy_all, args=(later, staged, done), daemon=True).start()
        return done

    def wait_staged(self) -> None:
        """Return once every tensor of the last save is copied (re-raises the copy's failure)."""
        copying, self._copying = self._copying, None
        if copying is not None:
            copying.result()

    def close(self) -> None:
        self.wait_staged()
        self._buffers = {}
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

    @torch.no_grad()
    def _copy(
        self,
        obj: Any,
        path: str,
        used: dict[str, torch.Tensor],
        memo: dict[Any, Any],
        later: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> Any:
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{path}/{k}", used, memo, later) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(self._copy(v, f"{path}/{i}", used, memo, later) for i, v in enumerate(obj))
        if isinstance(obj, DTensor):
            local = self._copy(obj.to_local(), path, used, memo, later)
            return DTensor.from_local(
                local, obj.device_mesh, obj.placements, run_check=False, shape=obj.size(), stride=obj.stride()
            )
        if type(obj) is torch.Tensor:
            storage = _storage(obj)
            view = (storage, obj.storage_offset(), obj.shape, obj.stride(), obj.dtype)
            if storage != 0 and view in memo:
                return memo[view]
            buffer = self._buffers.get(path)
            if (
                buffer is None
                or buffer.shape != obj.shape
                or buffer.dtype != obj.dtype
                or (buffer.stride() != obj.stride())
            ):
                pin = obj.device.type == "cuda"
                buffer = torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, pin_memory=pin)
            if storage in self._deferrable and obj.device.type == "cpu":
                later.append((buffer, obj))
            else:
                buffer.copy_(obj)
            used[path] = memo[view] = buffer
            return buffer
        if obj is None or isinstance(obj, (int, float, bool, str, bytes)):
            return obj
        return copy.deepcopy(obj)


def _storage(tensor: torch.Tensor) -> int:
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.untyped_storage().data_ptr()


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]], staged: dict[str, Any], done: Future) -> None:
    """The background copy (a thread of its own: it may lower its own priority)."""
    if hasattr(os, "setpriority"):  # who=0: this thread; a sandbox may forbid it: copy at normal priority
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
    try:
        with torch.no_grad():
            for buffer, source in pairs:
                buffer.copy_(source)
    except BaseException as err:
        done.set_exception(err)
    else:
        done.set_result(staged)
