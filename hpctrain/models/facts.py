"""The planner's fact sheet of a model (:class:`ModelFacts`), whatever its source. Torch-free.

One record for every model :mod:`hpctrain.plan` estimates: each parameter tensor (name, shape, bytes per
element, the dimension tensor parallelism splits, the pipeline stages holding it, its FSDP unit, whether
autocast caches a 16-bit copy of it, the declared special cases as flags), the blocks, positions per
sample, FLOPs, and a source of activations. Two sources fill it:

- **declared**: a built-in model's spec (:meth:`hpctrain.models.spec.TransformerSpec.facts`) lists its
  parameters from its declared shapes, and its activations are computed from them per block
  (:class:`TransformerShape`, read by :mod:`hpctrain.plan.activations`);
- **measured**: a model that declares nothing (a user's ``_target_``) is built by
  :mod:`hpctrain.submit.footprint`: the parameters are read on the meta device (names, shapes, dtypes:
  exact), the activations measured (:class:`Measured`): the bytes autograd saves for the backward of a
  forward on a few samples on the CPU, kept as a line ``fixed + per_sample · samples`` fitted through two
  batch sizes (the fixed part: what does not grow with the batch, such as autocast's 16-bit weight copies).

Both are facts of the model *under the run's split* (the stages of a pipeline, the dimensions of a
tensor-parallel plan), which the caller gives when it makes the sheet.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property


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
    # An input of a linear or conv whose 16-bit copy autocast caches for the step (declared; a measured
    # model's copies are in its measured activations' fixed part).
    autocast_copy: bool = False
    # Under tensor parallelism without FSDP its gradient is whole on every rank: DTensor's backward of a
    # vocabulary-split embedding lookup yields a replicated gradient (FSDP reduce-scatters it to the shard).
    whole_grad_under_tp: bool = False
    # A copy of a weight tied to another stage's (Megatron's embedding group: the last pipeline stage's LM
    # head holds its own copy of the token embedding): held and trained there, not a distinct parameter.
    copy: bool = False
    # The dimension expert parallelism splits (an expert's grouped weight: 0), None: on every rank. Such a
    # tensor is sharded by FSDP over the ranks holding the same experts only (Degrees.expert_fsdp).
    ep_dim: int | None = None
    # Of every token's computation, the share that uses this tensor (an expert's: top_k / experts; the
    # active parameters of a mixture of experts).
    active: float = 1.0
    # Trained (False: frozen, as a LoRA run's base weights: no gradient, no optimizer state).
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ------------------------------------------------------------------------------------ declared activations
@dataclass(frozen=True)
class Ends:
    """What a declared model's input and output ends keep for the backward, as facts the planner reads
    instead of asking which kind of model it is."""

    input_numel: int  # elements of one sample as the data gives it (T token ids, or C·H·W pixels)
    input_itemsize: int  # bytes per element of it (int64 ids, fp32 pixels)
    # Floating-point input: autocast and FSDP's mixed precision cast it to 16 bits, and the first layer
    # saves that copy (integer ids are looked up, not cast).
    input_float: bool
    input_fixed_bytes: int  # saved once per forward whatever the batch (a learned-position lookup's ids)
    head_positions: int  # positions per sample the head reads (every token for an LM, 1 class token)
    head_width: int  # logits per position read (the vocabulary, or the classes)
    # The final norm gathers the sequence under sequence parallelism and runs replicated (a head that reads
    # one position: hpctrain.parallel.tp's "gather_sequence").
    norm_gathers_sequence: bool
    # The embedding and the head split a vocabulary under tensor parallelism: the lookup saves its
    # shifted, masked ids and all-reduces its output, the head's input gradient is all-reduced and the
    # logits are gathered.
    vocab_parallel: bool


@dataclass(frozen=True)
class MoEShape:
    """A mixture of experts in place of a block's MLP (``hpctrain.models.moe.MoE``)."""

    experts: int
    top_k: int
    capacity: float  # 0: dropless


@dataclass(frozen=True)
class TransformerShape:
    """A declared pre-norm transformer (``hpctrain.models.layers.Block``): what the per-block formulas of
    :mod:`hpctrain.plan.activations` read."""

    n_layers: int
    d_model: int
    n_heads: int
    mlp_ratio: int
    dropout: float
    ends: Ends
    moe: MoEShape | None = None


# ------------------------------------------------------------------------------------ measured activations
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
class Measured:
    """Activations measured on the CPU (:mod:`hpctrain.submit.footprint`), one line set per regime."""

    samples: tuple[int, ...] = ()  # the batch sizes measured; () when not measured
    lines: tuple[Activations, ...] = ()
    note: str = ""  # why the activations were not measured ("" when they were)
    input_kind: str | None = None  # "tokens" (integer [B, T]) | "images" (float [B, C, H, W]) | None
    seconds: float = 0.0  # what building and measuring took

    def in_regime(self, regime: str) -> Activations | None:
        found = [a for a in self.lines if a.regime == regime]
        return found[0] if found else (self.lines[0] if self.lines else None)


# -------------------------------------------------------------------------------------------- the sheet
@dataclass(frozen=True)
class ModelFacts:
    """Everything :mod:`hpctrain.plan` knows of a model, declared or measured (see the module docstring)."""

    target: str
    params: tuple[ParamFact, ...]
    buffer_bytes: int  # registered buffers (running statistics, masks): on every rank, not sharded
    blocks: int  # FSDP / checkpointing units (hpctrain.parallel.blocks), 0: the model is one unit
    tokens_per_sample: int | None  # positions per sample the blocks see; None: unknown (rates per sample)
    activations: TransformerShape | Measured
    throughput_unit: str = "samples"  # what a rate is counted in beside samples (the model spec's)
    flops_per_token: float | None = None  # declared: forward + backward per position (PaLM's 6N + 12LHQT)
    flops_per_sample: float | None = None  # measured: forward + backward, counted (torch.utils.flop_counter)
    # PowerSGD's share of the gradient bytes is r(a + b)/(ab) for each a × b matrix; a declared transformer's
    # is estimated as for d × d blocks, 2r/d, with this d (None: counted per tensor).
    matrix_width: int | None = None

    @cached_property
    def n_params(self) -> int:
        """Distinct parameters (a tied weight's copy on another stage not counted again)."""
        return sum(p.numel for p in self.params if not p.copy)

    @cached_property
    def n_active(self) -> int:
        """Parameters a token uses (a mixture of experts: the router and top_k of the experts)."""
        return round(sum(p.numel * p.active for p in self.params if not p.copy))

    @cached_property
    def n_trainable(self) -> int:
        """Parameters trained (LoRA: the adapters only)."""
        return sum(p.numel for p in self.params if not p.copy and p.trainable)

    @property
    def param_bytes(self) -> int:
        return sum(p.numel * p.itemsize for p in self.params if not p.copy)

    @property
    def measured(self) -> Measured | None:
        """The measurement behind the sheet; None for a declared model."""
        return self.activations if isinstance(self.activations, Measured) else None

    def activations_in(self, regime: str) -> Activations | None:
        """The measured activations in ``regime`` (the first measured if not that one); None if declared."""
        return self.measured.in_regime(regime) if self.measured is not None else None

    def training_flops(self, samples: int) -> float:
        """Forward + backward FLOPs of ``samples``: declared per position, counted when measured, else 6·N
        per position (per sample when positions are unknown; Kaplan et al. 2020)."""
        if self.flops_per_token is not None:
            return self.flops_per_token * samples * (self.tokens_per_sample or 1)
        if self.flops_per_sample is not None:
            return self.flops_per_sample * samples
        return 6.0 * self.n_params * (self.tokens_per_sample or 1) * samples

    def powersgd_share(self, rank: int) -> float:
        """The share of the gradient bytes PowerSGD sends at ``rank`` (Vogels et al. 2019): it all-reduces
        P (a × r) and Q (b × r) for each a × b matrix, the other tensors whole."""
        if self.matrix_width is not None:
            return 2 * rank / self.matrix_width
        total, sent = 0, 0
        for q in self.params:
            total += q.numel
            rows = q.shape[0] if q.shape else 1
            cols = q.numel // rows if rows else 0
            sent += min(q.numel, rank * (rows + cols)) if len(q.shape) >= 2 else q.numel
        return sent / total if total else 1.0

    def describe_input(self) -> str:
        """What the measured batch was, for the plan's model line ("" when unknown or declared)."""
        m = self.measured
        if m is None or m.input_kind is None:
            return ""
        if m.input_kind == "tokens":
            return f", {self.tokens_per_sample} tokens per sample"
        return f", takes {m.input_kind}"


# The sheet of a measured model, by the name its callers in hpctrain.submit use.
MeasuredModel = ModelFacts


# ------------------------------------------------------------------------------------------------- adapters
def module_matches(name: str, pattern: str) -> bool:
    """Whether module ``name`` ends with ``pattern``'s atoms (``*`` any one atom), as PEFT's
    ``target_modules`` match (:mod:`hpctrain.models.adapters`)."""
    atoms, parts = pattern.split("."), name.split(".")
    if len(atoms) > len(parts):
        return False
    return all(a == "*" or a == p for a, p in zip(atoms, parts[len(parts) - len(atoms) :], strict=True))


def with_lora(facts: ModelFacts, rank: int, patterns: tuple[str, ...] | list[str]) -> ModelFacts:
    """``facts`` with LoRA adapters (:mod:`hpctrain.models.adapters`): every parameter frozen, and beside
    each matrix of a targeted module its ``lora_A`` [rank, in] (replicated) and ``lora_B`` [out, rank]
    (split as the matrix's output dimension), trained, in the same FSDP unit and stages."""
    params: list[ParamFact] = []
    for q in facts.params:
        params.append(dataclasses.replace(q, trainable=False))
        module = q.name.rsplit(".", 1)[0]
        if not q.name.endswith(".weight") or len(q.shape) != 2 or q.copy:
            continue
        if not any(module_matches(module, pattern) for pattern in patterns):
            continue
        out, inp = q.shape
        a_tp = 1 if q.tp_dim == 1 else None  # a row-wise split splits A's input dimension
        b_tp = 0 if q.tp_dim == 0 else None
        for suffix, shape, tp_dim in (("lora_A", (rank, inp), a_tp), ("lora_B", (out, rank), b_tp)):
            params.append(
                dataclasses.replace(
                    q,
                    name=f"{module}.{suffix}.weight",
                    shape=shape,
                    tp_dim=tp_dim,
                    autocast_copy=False,
                    whole_grad_under_tp=False,
                    trainable=True,
                )
            )
    return dataclasses.replace(facts, params=tuple(params))
