"""Where each parameter of a run lives under its layout (tensor, FSDP and pipeline splits), and the
constants the planner shares. Torch-free; see :mod:`hpctrain.plan.estimate` for the method and sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.config.shape import Degrees, RunShape, run_shape
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import ModelFacts, ParamFact, with_lora
from hpctrain.models.spec import ParamSpec, TransformerSpec

GIB = 2**30
MIB = 2**20
FP32 = 4
HALF = 2
INT64 = 8
# Kept free on every GPU: the CUDA context (~0.5 GiB), cuBLAS/cuDNN workspaces and NCCL communicators'
# buffers (a few hundred MiB per communicator), and allocator fragmentation. The caching allocator rounds
# and splits blocks; 5% of the device is a common working figure (PyTorch's memory notes; torchtitan keeps a
# similar margin), and ``expandable_segments`` reduces it.
CUDA_CONTEXT_GIB = 2.0
FRAGMENTATION = 0.05
# NCCL's ring collectives reach about 80% of the link's data-sheet bandwidth as bus bandwidth (nccl-tests'
# busbw on NVLink and InfiniBand).
COMM_EFFICIENCY = 0.8
# Share of a step's compute that DDP's bucketed all-reduce can hide behind: the backward (2 of 3 parts).
BACKWARD_SHARE = 2.0 / 3.0
# Selective checkpointing recomputes only element-wise work (norms, GELU, residual adds: no matmul FLOPs),
# which is memory-bound; assumed to cost 3% more compute time. An assumption, of the order Korthikanti et al.
# 2022 report for their selective scheme (a few percent, section 6).
SELECTIVE_RECOMPUTE = 0.03
LOOPED_SCHEDULES = ("interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble")


# --------------------------------------------------------------------------------------------- the model
def planned_model(cfg: Config) -> TransformerSpec:
    """The model's declared spec, which its fact sheet is made of; a ConfigError for a model that declares
    none (a user's ``_target_``: its facts are measured, :func:`hpctrain.submit.measure.measured_for`)."""
    spec = model_spec(cfg.model)
    shapes = spec.declared_shapes()
    if shapes is None:
        raise ConfigError(
            "model._target_",
            spec.target,
            "declares no shapes the planner can read: it is planned from the facts measured of it "
            "(hpctrain.submit.measure.measured_for)",
        )
    return shapes


def declared_facts(cfg: Config) -> ModelFacts:
    """The fact sheet of a built-in model under the run's pipeline split (a ConfigError for a model that
    declares none, see :func:`planned_model`)."""
    spec = planned_model(cfg)
    _check_plannable(spec)
    n_stages = run_shape(cfg).n_stages
    lora = cfg.model.lora
    adapters = (lora.rank, tuple(lora.targets) or spec.lora_targets) if cfg.model.adapters == "lora" else None
    # The search estimates hundreds of layouts of one model: build each split's sheet once.
    key = (type(spec), repr(spec), n_stages, adapters)
    if key not in _SHEETS:
        if len(_SHEETS) >= 64:
            _SHEETS.clear()
        sheet = spec.facts(n_stages)
        _SHEETS[key] = with_lora(sheet, *adapters) if adapters else sheet
    return _SHEETS[key]


_SHEETS: dict[tuple[Any, ...], ModelFacts] = {}

# The fact sheet lists every layer's tensors: a typo such as model.n_layers=1000000000000 would build it for
# hours. Both bounds are far beyond anything trained (the deepest transformers have about a thousand layers;
# the largest machines about 10 PB of accelerator memory, and training holds about 16 bytes a parameter):
# a model past either fits nowhere, and is refused from arithmetic before any sheet is built.
MAX_PLANNED_LAYERS = 16_384
MAX_TRAINING_BYTES = 2**60  # 1 EiB
TRAINING_BYTES_PER_PARAM = 16  # fp32 weights, gradients and AdamW's two moments


def _check_plannable(spec: TransformerSpec) -> None:
    def numel(specs: Any) -> int:
        return sum(math.prod(p.shape) for p in specs)

    per_layer = numel(spec.block_param_specs())
    n_params = numel(spec.input_params()) + numel(spec.output_params()) + per_layer * spec.n_layers
    most = max(1, (MAX_TRAINING_BYTES // TRAINING_BYTES_PER_PARAM) // max(per_layer, 1))
    too_big = n_params * TRAINING_BYTES_PER_PARAM > MAX_TRAINING_BYTES
    if spec.n_layers > MAX_PLANNED_LAYERS or too_big:
        why = (
            f"{n_params:.3g} parameters (model.d_model={spec.d_model}) fit on no machine: training holds "
            f"about {TRAINING_BYTES_PER_PARAM} bytes a parameter, more than 1 EiB here"
            if too_big
            else f"deeper than any model the planner plans (at most {MAX_PLANNED_LAYERS} layers)"
        )
        raise ConfigError("model.n_layers", spec.n_layers, why, valid=f"1 to {min(MAX_PLANNED_LAYERS, most)}")


def local_numel(spec: ParamSpec | ParamFact, tp: int, shards: int, shard_rank: int) -> int:
    """Elements of ``spec`` on one rank: the TP shard, then FSDP2's dim-0 chunk of it (``torch.chunk``:
    ⌈n / shards⌉ rows each, the last ranks fewer or none)."""
    shape = list(spec.shape)
    if spec.tp_dim is not None and tp > 1:
        shape[spec.tp_dim] //= tp
    if shards > 1:
        chunk = -(-shape[0] // shards)
        shape[0] = max(0, min(chunk, shape[0] - shard_rank * chunk))
    return math.prod(shape)


def rank_stages(schedule: str, pp_rank: int, pp: int, per_rank: int) -> list[int]:
    """The pipeline stages rank ``pp_rank`` runs; the same rule as ``hpctrain.parallel.pipeline.stage_ids``
    (which imports torch): looped r, r + pp, ..., or r and 2·pp − 1 − r for the V schedule."""
    if schedule == "zbv_zero_bubble":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(per_rank)]


# ------------------------------------------------------------------------------------------- the layout
@dataclass(frozen=True)
class Layout:
    """The numbers of a config that the estimate needs, read from its RunShape (``shape``: the derived
    numbers themselves) and its parallel group."""

    shape: RunShape
    degrees: Degrees
    precision: str
    regime: str  # fp32 | autocast (16-bit matmuls, fp32 parameters) | fsdp_mixed (FSDP's 16-bit parameters)
    sharded: bool  # FSDP applies (dp_shard × ep × cp > 1: Degrees.fsdp)
    per_rank: int  # pipeline stages per rank
    n_stages: int
    microbatches: int  # pipeline micro-batches per pass (1 without pipeline)
    passes: int  # forward/backward passes per optimizer step (gradient accumulation)
    micro_batch: int  # samples per micro-batch
    tokens: int  # tokens per sample the blocks of one rank see (context parallelism: its share)
    seq_shards: int  # sequence parallelism divides the residual stream by this
    ac: str  # activation checkpointing: none | full | selective

    @property
    def n_tokens(self) -> int:
        """Tokens per micro-batch on one rank (before sequence parallelism)."""
        return self.micro_batch * self.tokens


def layout_of(cfg: Config, tokens: int | None = None) -> Layout:
    """``tokens``: positions per sample (of the model's fact sheet; None: the built-in model's declared)."""
    shape = run_shape(cfg)
    d, p = shape.degrees, cfg.parallel
    return Layout(
        shape=shape,
        degrees=d,
        precision=cfg.trainer.precision,
        regime=shape.regime,
        sharded=d.fsdp > 1,
        per_rank=shape.stages_per_rank,
        n_stages=shape.n_stages,
        microbatches=shape.microbatches,
        passes=shape.passes,
        micro_batch=shape.micro_batch_size,
        tokens=(planned_model(cfg).tokens_per_sample if tokens is None else tokens) // d.cp,
        seq_shards=d.tp if d.tp > 1 and p.sequence_parallel else 1,
        ac=p.activation_checkpointing,
    )
