"""What the planner learns of a model that declares no shapes (a user's ``_target_``) by building it:
torch-free records, filled by :mod:`hpctrain.submit.footprint` and read by :mod:`hpctrain.plan.user`.

The parameters are read from the model built on the meta device (names, shapes, dtypes: exact). The
activations cannot be derived from parameters: they are measured, as the bytes autograd saves for the
backward of a forward on a few samples on the CPU, and kept as a line ``fixed + per_sample · samples``
fitted through two batch sizes (the fixed part: what does not grow with the batch, such as autocast's
16-bit weight copies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamFact:
    """One parameter tensor: its qualified name, shape, bytes per element, and the FSDP unit holding it
    (the index of its block, :mod:`hpctrain.parallel.blocks`; -1 for the root)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    unit: int = -1
    tp_dim: int | None = None  # the dimension the run's tensor-parallel plan splits (None: replicated)
    stages: tuple[int, ...] | None = None  # the pipeline stages holding it under the run's split (None: all)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Linear:
    """Bytes as a function of the samples of a micro-batch: ``fixed + per_sample · samples``."""

    fixed: float
    per_sample: float

    def at(self, samples: int) -> int:
        return max(0, round(self.fixed + self.per_sample * samples))

    @classmethod
    def through(cls, points: dict[int, int]) -> Linear:
        """The line through measurements {samples: bytes} (the two extreme ones), neither part negative."""
        lo, hi = min(points), max(points)
        if lo == hi:
            return cls(0.0, points[lo] / lo)
        slope = max(0.0, (points[hi] - points[lo]) / (hi - lo))
        return cls(max(0.0, points[lo] - slope * lo), slope)


@dataclass(frozen=True)
class Activations:
    """Activation bytes per micro-batch in one precision regime (fp32 | autocast | fsdp_mixed, as in
    :class:`hpctrain.plan.layout.Layout`), the batch itself included."""

    regime: str
    saved: Linear  # without activation checkpointing: everything saved for the backward
    checkpointed: Linear  # each block checkpointed: what is saved outside the blocks, and their inputs
    recompute: Linear  # the largest block's own saved bytes: held while it is recomputed in the backward
    outside: Linear = Linear(0.0, 0.0)  # what is saved outside the blocks (the input and output ends)
    output: Linear = Linear(0.0, 0.0)  # bytes of the logits: their gradient and the loss's fp32 one, backward


@dataclass(frozen=True)
class MeasuredModel:
    target: str
    params: tuple[ParamFact, ...]
    buffer_bytes: int  # registered buffers (running statistics, masks): on every rank, not sharded
    blocks: int  # FSDP / checkpointing units found (hpctrain.parallel.blocks), 0: the model is one unit
    input_kind: str | None  # "tokens" (integer [B, T]) | "images" (float [B, C, H, W]) | None
    tokens_per_sample: int  # T for token input, else 1
    samples: tuple[int, ...] = ()  # the batch sizes measured; () when not measured
    activations: tuple[Activations, ...] = ()
    flops_per_sample: float | None = None  # forward + backward, counted (torch.utils.flop_counter)
    note: str = ""  # why the activations were not measured ("" when they were)
    seconds: float = 0.0  # what building and measuring took

    @property
    def n_params(self) -> int:
        return sum(p.numel for p in self.params)

    @property
    def param_bytes(self) -> int:
        return sum(p.numel * p.itemsize for p in self.params)

    def unit_numel(self, unit: int) -> int:
        return sum(p.numel for p in self.params if p.unit == unit)

    def activations_in(self, regime: str) -> Activations | None:
        found = [a for a in self.activations if a.regime == regime]
        return found[0] if found else (self.activations[0] if self.activations else None)

    def training_flops_per_sample(self) -> float:
        """Counted when measured, else 6·N per token (token input) or per sample (Kaplan et al. 2020)."""
        if self.flops_per_sample is not None:
            return self.flops_per_sample
        return 6.0 * self.n_params * self.tokens_per_sample
