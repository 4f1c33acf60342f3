"""Pipeline parallelism with torch.distributed.pipelining: split a model into stages, run a schedule.

The split follows the model's declaration: ``PIPELINE_INPUT`` modules go to the first stage,
``PIPELINE_OUTPUT`` ones to the last, and the blocks are divided evenly in order. Each stage is a copy of
the whole model with what it does not own set to None, so parameter names stay those of the whole model
and a checkpoint saved under one pipeline layout loads under any other, or none. A weight tied across
stages (an embedding and the LM head) becomes one copy per stage, kept equal by Megatron-LM's embedding
group (:mod:`hpctrain.parallel.shared`).

Schedules (stages per rank): GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush, Narayanan et al. 2021)
hold one stage per rank; interleaved 1F1B (Narayanan et al. 2021, §2.2) holds several, looped, to shrink
the bubble by that factor; the zero-bubble schedules (Qi et al. 2023) also split each backward into its
input-gradient and weight-gradient halves to fill the bubble, the V variant placing stages r and 2·pp−1−r
on rank r.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.errors import ConfigError

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
# parallel.schedule → torch.distributed.pipelining's class name. The module is imported only when a pipeline
# is built: it imports torch._dynamo, about a second of every rank's start-up on a CPU (a quarter of it).
SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "interleaved_zero_bubble": "ScheduleInterleavedZeroBubble",
    "zbv_zero_bubble": "ScheduleZBVZeroBubble",
}


def stage_ids(schedule: str, pp_rank: int, pp: int, per_rank: int) -> list[int]:
    """Which of the ``pp × per_rank`` stages this rank runs: looped (r, r + pp, ...) or, for the V-shaped
    schedule, r and 2·pp − 1 − r (so the first and last stage share rank 0)."""
    if schedule == "zbv_zero_bubble":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(per_rank)]


def stage_owners(schedule: str, pp: int, per_rank: int) -> list[int]:
    """For each stage, the pipeline rank that runs it."""
    owners = [0] * (pp * per_rank)
    for rank in range(pp):
        for stage in stage_ids(schedule, rank, pp, per_rank):
            owners[stage] = rank
    return owners


def dropped_modules(model: nn.Module, stage: int, n_stages: int) -> list[str]:
    """The modules (dotted paths) that ``stage`` of ``n_stages`` does not run: the other stages' blocks,
    ``PIPELINE_INPUT`` off the first stage, ``PIPELINE_OUTPUT`` off the last."""
    if not all(hasattr(type(model), a) for a in ("PIPELINE_INPUT", "PIPELINE_OUTPUT")) or not isinstance(
        getattr(model, "layers", None), nn.ModuleDict
    ):  # the pre-submit check refuses this layout; a direct caller gets the same line
        raise ConfigError(
            "parallel.pp",
            n_stages,
            f"model {type(model).__name__} declares no pipeline split "
            "(PIPELINE_INPUT / PIPELINE_OUTPUT and its blocks in a `layers` ModuleDict)",
        )
    names = list(model.layers.keys())
    per_stage = len(names) // n_stages
    keep = set(names[stage * per_stage : (stage + 1) * per_stage])
    dropped = [f"layers.{name}" for name in names if name not in keep]
    if stage != 0:
        dropped += type(model).PIPELINE_INPUT
    if stage != n_stages - 1:
        dropped += type(model).PIPELINE_OUTPUT
    return dropped


def split_stage(model: nn.Module, stage: int, n_stages: int) -> nn.Module:
    """A copy of ``model`` keeping only what ``stage`` of ``n_stages`` runs.

    A parameter the whole model registers twice (a tied embedding and LM head) is one parameter in a stage
    that keeps both names, and a copy of its own in each stage that keeps one of them (Megatron's
    embedding group: :mod:`hpctrain.parallel.shared` keeps the copies equal)."""
    dropped = dropped_modules(model, stage, n_stages)
    part = copy.deepcopy(model)
    for path in dropped:
        owner, _, name = path.rpartition(".")
        if owner:
            del part.get_submodule(owner)[name]
        else:
            setattr(part, name, None)
    return part


class Pipeline:
    """This rank's stages and the schedule that drives them.

    ``step`` runs one forward/backward of the pipeline over ``n_microbatches`` micro-batches. The loss of
    each micro-batch is computed by ``loss_fn`` on the last stage; what it returns is what is
    back-propagated (the trainer divides and scales it), and the unscaled values are kept for reporting.
    """

    def __init__(
        self,
        parts: dict[int, nn.Module],
        owners: list[int],
        schedule: str,
        n_microbatches: int,
        device: torch.device,
        group: dist.ProcessGroup,
    ) -> None:
        """``parts``: this rank's stages by index; ``owners[s]``: the pipeline rank that runs stage s."""
        self.parts = parts
        self.owners = owners
        self.n_stages = n_stages = len(owners)
        self.pp_rank = dist.get_rank(group)
        self.device = device
        self.group = group
        self.has_first = 0 in parts
        self.has_last = n_stages - 1 in parts
        self.n_microbatches = n_microbatches
        self._loss_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
        self._unscaled: dict[int, torch.Tensor] = {}
        from torch.distributed import pipelining
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

        stages = [
            pipelining.PipelineStage(part, i, n_stages, device, group=group) for i, part in parts.items()
        ]
        cls = getattr(pipelining, SCHEDULES[schedule])
        # scale_grads=False: the loss function already divides by the micro-batch count (and the number of
        # accumulated pipeline steps), as a non-pipelined step does.
        options = {"n_microbatches": n_microbatches, "loss_fn": self._loss, "scale_grads": False}
        if issubclass(cls, PipelineScheduleSingle):
            self.schedule = cls(stages[0], **options)
        else:
            assert issubclass(cls, PipelineScheduleMulti)
            self.schedule = cls(stages, **options)

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self._loss_fn is not None
        loss, backpropagated = self._loss_fn(output, target)
        # The schedule reports what it back-propagated, per micro-batch; map each back to its unscaled loss.
        # (It also calls this once on uninitialised outputs while it sets up, so a plain list of every call
        # would be wrong.) Ids stay unique while the schedule holds the tensors.
        self._unscaled[id(backpropagated)] = loss.detach()
        return backpropagated

    def step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Train on one batch; return the sum of the micro-batches' losses (0 off the last stage).

        ``loss_fn(logits, targets)`` → (loss, what to back-propagate)."""
        self._loss_fn, self._unscaled = loss_fn, {}
        args = (inputs,) if self.has_first else ()
        losses: list[torch.Tensor] = []
        self.schedule.step(*args, target=targets if self.has_last else None, losses=losses)
        total = torch.zeros((), device=inputs.device)
        for loss in losses:
            total += self._unscaled[id(loss)]
        self._unscaled = {}
        return total

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """Forward only, for evaluation: the last stage's rank gets the logits of the whole batch, the others
        None. Stages run one after the other on the whole batch, activations sent point to point; no
        schedule (torch 2.13's ``eval`` of the zero-bubble V schedule tries to run backward actions)."""
        x: torch.Tensor | None = inputs if self.has_first else None
        for stage in range(self.n_stages):
            if self.owners[stage] != self.pp_rank:
                continue
            previous = self.owners[stage - 1] if stage > 0 else self.pp_rank
            if previous != self.pp_rank:
                x = self._receive(previous)
            assert x is not None
            x = self.parts[stage](x)
            following = self.owners[stage + 1] if stage + 1 < self.n_stages else self.pp_rank
            if following != self.pp_rank:
                self._send(x, following)
        return x if self.has_last else None

    def _send(self, x: torch.Tensor, pp_rank: int) -> None:
        # The shape and dtype go first, so the receiver can allocate: stage outputs' shapes vary with the
        # batch, sequence parallelism and mixed precision.
        header = torch.tensor([DTYPES.index(x.dtype), x.dim(), *x.shape], dtype=torch.int64, device=x.device)
        peer = dist.get_global_rank(self.group, pp_rank)
        dist.send(torch.tensor([header.numel()], device=x.device), peer, group=self.group)
        dist.send(header, peer, group=self.group)
        dist.send(x.contiguous(), peer, group=self.group)

    def _receive(self, pp_rank: int) -> torch.Tensor:
        peer = dist.get_global_rank(self.group, pp_rank)
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.recv(length, peer, group=self.group)
        header = torch.zeros(int(length), dtype=torch.int64, device=self.device)
        dist.recv(header, peer, group=self.group)
        dtype, shape = DTYPES[int(header[0])], [int(n) for n in header[2:]]
        x = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(x, peer, group=self.group)
        return x
