"""Where each parameter of a run lives under its layout (tensor, FSDP and pipeline splits), and the
constants the planner shares. Torch-free; see :mod:`hpctrain.plan.estimate` for the method and sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.config.schema import Config, GPTConfig, ViTConfig
from hpctrain.config.shape import (
    Degrees,
    degrees,
    global_batch_size,
    samples_per_pass,
    stages_per_rank,
)
from hpctrain.models.flops import tokens_per_sample

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
@dataclass(frozen=True)
class ParamSpec:
    """One parameter tensor of the model, as ``hpctrain.models`` creates it."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = (
        None  # the dimension tensor parallelism shards (hpctrain.parallel.tp), None: replicated
    )
    autocast_copy: bool = False  # an input of a linear or conv: autocast caches a 16-bit copy for the step


def block_params(model: GPTConfig | ViTConfig) -> tuple[ParamSpec, ...]:
    """One ``hpctrain.models.layers.Block``: q/k/v and fc_in split by output (column-wise, with their biases),
    o and fc_out by input (row-wise, bias replicated); the LayerNorms are replicated."""
    d, hidden = model.d_model, model.d_model * model.mlp_ratio
    specs = [ParamSpec("ln1.weight", (d,)), ParamSpec("ln1.bias", (d,))]
    for name in ("q", "k", "v"):
        specs += [
            ParamSpec(f"attn.{name}.weight", (d, d), 0, True),
            ParamSpec(f"attn.{name}.bias", (d,), 0, True),
        ]
    specs += [ParamSpec("attn.o.weight", (d, d), 1, True), ParamSpec("attn.o.bias", (d,), None, True)]
    specs += [ParamSpec("ln2.weight", (d,)), ParamSpec("ln2.bias", (d,))]
    specs += [
        ParamSpec("mlp.fc_in.weight", (hidden, d), 0, True),
        ParamSpec("mlp.fc_in.bias", (hidden,), 0, True),
        ParamSpec("mlp.fc_out.weight", (d, hidden), 1, True),
        ParamSpec("mlp.fc_out.bias", (d,), None, True),
    ]
    return tuple(specs)


def input_params(model: GPTConfig | ViTConfig) -> tuple[ParamSpec, ...]:
    """What the first pipeline stage keeps (the models' ``PIPELINE_INPUT``). GPT's token embedding is split
    over the vocabulary under TP; tied, it is also the LM head's weight (a linear input)."""
    d = model.d_model
    if isinstance(model, GPTConfig):
        return (
            ParamSpec("tok_emb.weight", (model.vocab_size, d), 0, model.tie_embeddings),
            ParamSpec("pos_emb.weight", (model.seq_len, d)),
        )
    n_patches = (model.image_size // model.patch_size) ** 2
    return (
        ParamSpec("patch_emb.weight", (d, model.in_channels, model.patch_size, model.patch_size), None, True),
        ParamSpec("patch_emb.bias", (d,), None, True),
        ParamSpec("cls_token", (1, 1, d)),
        ParamSpec("pos_emb", (1, n_patches + 1, d)),
    )


def output_params(model: GPTConfig | ViTConfig) -> tuple[ParamSpec, ...]:
    """What the last pipeline stage keeps (``PIPELINE_OUTPUT``): the final norm and the head (none of its
    own when GPT's head is tied to the token embedding)."""
    d = model.d_model
    norm = (ParamSpec("norm.weight", (d,)), ParamSpec("norm.bias", (d,)))
    if isinstance(model, GPTConfig):
        return (
            norm
            if model.tie_embeddings
            else (*norm, ParamSpec("head.weight", (model.vocab_size, d), 0, True))
        )
    return (
        *norm,
        ParamSpec("head.weight", (model.num_classes, d), None, True),
        ParamSpec("head.bias", (model.num_classes,), None, True),
    )


def local_numel(spec: ParamSpec, tp: int, shards: int, shard_rank: int) -> int:
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
    """The numbers of a config that the estimate needs, derived once."""

    degrees: Degrees
    precision: str
    regime: str  # fp32 | autocast (16-bit matmuls, fp32 parameters) | fsdp_mixed (FSDP's 16-bit parameters)
    sharded: bool  # FSDP applies (a dp_shard dimension > 1)
    per_rank: int  # pipeline stages per rank
    n_stages: int
    microbatches: int  # pipeline micro-batches per pass (1 without pipeline)
    passes: int  # forward/backward passes per optimizer step (gradient accumulation)
    micro_batch: int  # samples per micro-batch
    tokens: int  # tokens per sample the blocks see
    seq_shards: int  # sequence parallelism divides the residual stream by this
    ac: str  # activation checkpointing: none | full | selective

    @property
    def n_tokens(self) -> int:
        """Tokens per micro-batch on one rank (before sequence parallelism)."""
        return self.micro_batch * self.tokens


def layout_of(cfg: Config) -> Layout:
    d = degrees(cfg)
    p, t = cfg.parallel, cfg.trainer
    sharded = d.dp_shard > 1
    regime = "fp32" if t.precision == "fp32" else ("fsdp_mixed" if sharded else "autocast")
    per_rank = stages_per_rank(p) if d.pp > 1 else 1
    microbatches = p.microbatches if d.pp > 1 else 1
    passes = max(1, global_batch_size(cfg) // samples_per_pass(cfg))
    return Layout(
        degrees=d,
        precision=t.precision,
        regime=regime,
        sharded=sharded,
        per_rank=per_rank,
        n_stages=d.pp * per_rank,
        microbatches=microbatches,
        passes=passes,
        micro_batch=t.micro_batch_size,
        tokens=tokens_per_sample(cfg.model),
        seq_shards=d.tp if d.tp > 1 and p.sequence_parallel else 1,
        ac=p.activation_checkpointing,
    )
