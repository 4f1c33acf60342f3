"""The few collectives the checkpoint service needs, which are no-ops in one process (a tool reading a
checkpoint, a single-rank run without a process group)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if distributed() else 1


def barrier() -> None:
    if distributed():
        dist.barrier()


def sum_over_ranks(values: list[int], group: dist.ProcessGroup | None) -> list[int]:
    if not distributed() or dist.get_world_size() == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, group=group)
    return [int(v) for v in tensor]


def gather_over_ranks(value: Any, group: dist.ProcessGroup | None) -> list[Any]:
    if not distributed() or dist.get_world_size() == 1:
        return [value]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, value, group=group)
    return every
