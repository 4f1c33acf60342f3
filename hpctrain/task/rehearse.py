"""A rehearsal of a plan's start-up: every distinct rank's, run here, with torch's fake process group.

``hpctrain plan OVERRIDES --rehearse`` (``hpctrain.cli.plan``) calls :func:`rehearse`. An error that only
start-up shows (a tensor-parallel plan that names a module it cannot split, a pipeline split that leaves a
stage empty, an optimizer that refuses a sharded parameter) otherwise costs a queue wait and an allocation;
here it is one line naming the rank and its role. torchtitan rehearses a large configuration on one GPU the
same way (``COMM_MODE=fake_backend``, its docs/debugging.md): a process group whose collectives move no data.

For each rehearsed rank, in this one process, one after the other: a fake process group of the plan's world
size in which this process is that rank; the model built on the meta device (shapes, no memory), its LoRA
adapters; ``hpctrain.parallel.apply.parallelize`` as the job runs it (the mesh, the pipeline split, TP/SP,
CP, EP, activation checkpointing, compile's wrapping, FSDP, DDP or the schedule); the real optimizer, its
state created by one step on zero gradients; the checkpoint's state (``ModelOptimizerState``, as a save
takes it) through DCP's own save planner, whose local plan is the shard layout this rank writes; and this
rank's share of a global batch (``hpctrain.data.sampler.shard_for_rank``) split into its passes.

Which ranks: one per distinct role, i.e. every combination of the pipeline stage, tensor-parallel, context-
parallel and expert-parallel coordinates, at the first and the last FSDP shard (⌈n / dp_shard⌉-row chunks:
the first holds the most, the last what is left) and the first replica (replicas hold the same). A rank in
between differs from these only in which rows it holds. The data split is checked for every data-parallel
rank (arithmetic only).

Measured per rank from the sharded tensors (DTensor local shards): the bytes of parameters (a tied weight
once), gradients and optimizer state, and of the checkpoint's local save plan.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hpctrain import torchapi
from hpctrain.config.schema import Config
from hpctrain.config.shape import MESH_DIMS, RunShape, run_shape
from hpctrain.data.sampler import shard_for_rank, split_micro_batches
from hpctrain.errors import printable
from hpctrain.models import build_model
from hpctrain.models.adapters import add_lora

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Role:
    """A rank and its coordinates in the mesh (the dimensions of size > 1)."""

    rank: int
    coords: tuple[tuple[str, int], ...]

    def coordinate(self, dim: str) -> int:
        return dict(self.coords).get(dim, 0)

    def __str__(self) -> str:
        return " · ".join(f"{dim} {i}" for dim, i in self.coords) or "the only rank"


@dataclass(frozen=True)
class Rehearsed:
    """One rank's start-up, as rehearsed."""

    role: Role
    pp_rank: int
    shard_rank: int  # its index in FSDP's group (dp_shard × ep × cp): which chunk of each weight it holds
    params: int  # bytes of its parameters (a tied weight once)
    grads: int
    optimizer: int
    # Bytes of its local DCP save plan: what it offers to write, before DCP's global plan keeps one copy of
    # what several ranks offer (a rank whose FSDP shard of a small tensor is empty offers it whole).
    checkpoint: int
    checkpoint_items: int
    dp: tuple[int, int]  # (index, size) of its slice of each global batch
    samples: int  # its samples of each step
    seconds: float


class StartupFailure(Exception):
    """What a rank would hit at start-up: ``str()`` is one line naming the rank, its role and the step."""

    def __init__(self, role: Role, step: str, cause: BaseException) -> None:
        self.role, self.step, self.cause = role, step, cause
        what = printable(str(cause)) or type(cause).__name__
        super().__init__(
            f"rank {role.rank} ({role}) fails at start-up in {step}: {type(cause).__name__}: {what}"
        )


def roles(shape: RunShape) -> list[Role]:
    """The ranks a rehearsal runs (module docstring), in rank order. The mesh is row-major over
    :data:`MESH_DIMS` (``hpctrain.parallel.mesh.build_mesh``)."""
    sizes = [(dim, size) for dim, size in ((d, getattr(shape.degrees, d)) for d in MESH_DIMS) if size > 1]
    last_shard = shape.degrees.dp_shard - 1
    chosen = []
    for rank in range(shape.world_size):
        coords, rest = [], rank
        for dim, size in reversed(sizes):
            rest, index = divmod(rest, size)
            coords.append((dim, index))
        role = Role(rank, tuple(reversed(coords)))
        if role.coordinate("dp_replicate") == 0 and role.coordinate("dp_shard") in (0, last_shard):
            chosen.append(role)
    return chosen


def rehearse(
    cfg: Config, ranks: list[Role] | None = None, progress: Callable[[Rehearsed], None] | None = None
) -> list[Rehearsed]:
    """Rehearse the start-up of ``ranks`` (default :func:`roles`); raise :class:`StartupFailure` for the
    first that fails. Must run in a process without a process group of its own (the CLI's)."""
    shape = run_shape(cfg)
    check_data_split(cfg, shape)
    done = []
    for role in ranks if ranks is not None else roles(shape):
        began = time.perf_counter()
        with _fake_group(role, shape.world_size):
            result = _rank(cfg, shape, role, began)
        done.append(result)
        if progress is not None:
            progress(result)
    return done


def check_data_split(cfg: Config, shape: RunShape) -> None:
    """Every data-parallel rank's share of a global batch splits into its passes, and the shares cover the
    batch once (what ``hpctrain.data.stream.BatchStream`` cuts at every step)."""
    batch = np.arange(shape.global_batch_size, dtype=np.int64)
    taken = []
    for dp_rank in range(shape.dp):
        share = shard_for_rank(batch, dp_rank, shape.dp)
        passes = split_micro_batches(share, shape.rank_samples_per_pass)
        if sum(len(p) for p in passes) != len(share):
            raise ValueError(f"data-parallel rank {dp_rank}'s {len(share)} samples do not split into passes")
        taken.append(share)
    if not np.array_equal(np.sort(np.concatenate(taken)), batch):
        raise ValueError("the data-parallel ranks' shares do not cover the global batch once")


@contextlib.contextmanager
def _fake_group(role: Role, world_size: int) -> Iterator[None]:
    if world_size > 1:
        try:
            torchapi.init_fake_process_group(role.rank, world_size)
        except Exception as err:
            raise StartupFailure(role, "the process group", err) from err
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _rank(cfg: Config, shape: RunShape, role: Role, began: float) -> Rehearsed:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from hpctrain.checkpoint.state import ModelOptimizerState
    from hpctrain.parallel.apply import parallelize
    from hpctrain.train.optim import build_optimizer

    step = "building the model on the meta device"
    try:
        with torch.device("meta"):
            model = build_model(cfg.model)
            if cfg.model.adapters == "lora":
                step = "adding the LoRA adapters"
                add_lora(model, cfg.model.lora)
        step = "parallelize (the mesh, pipeline split, TP/SP, CP, EP, checkpointing, FSDP or DDP)"
        # A CPU mesh whatever the job's devices: this machine need not have them, and with the fake
        # backend the mesh's device type picks nothing; no tensor moves (the model is on the meta device).
        par = parallelize(model, cfg, torch.device("cpu"), shape)
        step = "the optimizer"
        optimizer = build_optimizer(par.model, cfg.optim)
        distinct = list({id(p): p for p in par.model.parameters()}.values())
        for p in distinct:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()  # creates the state as a first step does
        state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        step = "the checkpoint's save plan"
        saved = ModelOptimizerState(
            par.model, optimizer, par.saved_names, trainable_only=cfg.model.adapters != "none"
        ).state_dict()
        planner = DefaultSavePlanner()
        planner.set_up_planner({"model_optim": saved}, None, role.rank == 0)
        plan = planner.create_local_plan()
        ckpt = sum(_item_bytes(item) for item in plan.items)
        step = "the data split"
        dp_rank, dp_size = par.data_parallel
        samples = len(shard_for_rank(np.arange(shape.global_batch_size), dp_rank, dp_size))
    except StartupFailure:
        raise
    except Exception as err:
        raise StartupFailure(role, step, err) from err
    degrees = shape.degrees
    return Rehearsed(
        role=role,
        pp_rank=par.dims.pp_rank,
        shard_rank=degrees.fsdp_index(
            role.coordinate("dp_shard"), role.coordinate("ep"), role.coordinate("cp")
        ),
        params=sum(_local_bytes(p) for p in distinct),
        grads=sum(_local_bytes(p.grad) for p in distinct if p.grad is not None),
        optimizer=sum(_local_bytes(v) for v in state),
        checkpoint=ckpt,
        checkpoint_items=len(plan.items),
        dp=(dp_rank, dp_size),
        samples=samples,
        seconds=time.perf_counter() - began,
    )


def _item_bytes(item: Any) -> int:
    """A write item's bytes: a tensor piece's elements × its dtype's size, a blob (plain data) ~0."""
    data = item.tensor_data
    return 0 if data is None else math.prod(data.chunk.sizes) * data.properties.dtype.itemsize
