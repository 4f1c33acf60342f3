"""Memory per GPU and time per step of a run, computed from its typed config alone.

Must not import torch: ``hpctrain plan`` and the check before every submission run on login nodes.

Memory is counted per rank, for the model as ``hpctrain.parallel.apply.parallelize`` lays it out:

- **Model state** from the exact parameter shapes of ``hpctrain.models`` (GPT / ViT), split as the real code
  splits them: tensor parallelism shards the Megatron column/row dimensions and the vocabulary (Shoeybi et al.
  2019), FSDP2 then cuts dimension 0 of each (TP-local) tensor into ``dp_shard`` chunks of ⌈n / dp_shard⌉
  rows (``torch.chunk``), so the first data-parallel rank holds the most; a pipeline rank holds its stages'
  blocks, the first stage the embeddings, the last the final norm and head. Parameters and gradients are
  fp32 in every precision (FSDP's mixed precision keeps fp32 master shards and reduces in fp32; autocast
  keeps fp32 parameters); AdamW keeps two fp32 states per parameter and a 4-byte step count per tensor,
  SGD with momentum one fp32 buffer (Rajbhandari et al. 2020, ZeRO, section 3: 16 bytes per parameter
  for mixed-precision Adam, of which ZeRO-3 shards all).
- **Activations**: the bytes autograd and activation checkpointing keep from the forward for the backward,
  per micro-batch, from the operations of ``hpctrain.models.layers`` (which tensors each op saves, in which
  dtype; Korthikanti et al. 2022, "Reducing Activation Recomputation", section 4, count the same way for
  Megatron blocks: 34·s·b·h bytes per layer in 16 bits without checkpointing), times the micro-batches in
  flight: one without pipeline, ``pp − r`` on pipeline rank r under 1F1B and all of them under GPipe
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training", section 2.2), torch's warm-up
  count for the looped schedules.
- **Buffers**: communication and runtime memory outside the two above: DDP buckets, FSDP's all-gathered
  (unsharded) blocks and the prefetched next one, TP/SP gathers, pipeline receive buffers, autocast's
  low-precision weight copies, the loss's gradient, and with activation checkpointing the one block being
  recomputed.

A safety reserve is kept on every GPU: :data:`CUDA_CONTEXT_GIB` for the CUDA context, cuBLAS/cuDNN
workspaces and NCCL's communicator buffers, and :data:`FRAGMENTATION` of the GPU's memory for the caching
allocator's fragmentation.

Time per step: model FLOPs (``hpctrain.models.flops.flops_per_token``, 6N + 12·L·H·Q·T per token, plus a
second forward under full activation checkpointing) at ``cluster.achievable_mfu`` of ``cluster.peak_flops``,
the communication of each strategy at :data:`COMM_EFFICIENCY` of the link bandwidth (ring collectives send
2(n−1)/n of the data per all-reduce and (n−1)/n per all-gather or reduce-scatter), data-parallel
communication hidden behind compute where it overlaps, and the pipeline bubble (pp − 1)/(m + pp − 1)
(Narayanan et al. 2021, section 2.2; divided by the stages per rank for the looped schedules).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from hpctrain.config.errors import ConfigError
from hpctrain.config.schema import Config, GPTConfig, ViTConfig
from hpctrain.config.shape import (
    Degrees,
    degrees,
    global_batch_size,
    samples_per_pass,
    stages_per_rank,
    world_size,
)
from hpctrain.models.flops import flops_per_token, param_count, tokens_per_sample

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


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of what a block saves, by precision regime (see ``block_activation_bytes``)."""

    residual: int  # the residual stream and the LayerNorms' inputs
    matmul_out: int  # outputs of linears and attention
    matmul_in: int  # the inputs linears save (autocast: the 16-bit copy it makes of an fp32 input)
    qkv_input_copies: int  # autocast casts the shared q/k/v input once per linear: three copies
    logits: int


def dtypes(regime: str) -> Dtypes:
    if regime == "fp32":
        return Dtypes(FP32, FP32, FP32, 1, FP32)
    if regime == "autocast":
        # LayerNorm and the residual adds stay fp32 under autocast; linears cast their input (not cached:
        # only leaf tensors are) and compute in 16 bits.
        return Dtypes(FP32, HALF, HALF, 3, HALF)
    return Dtypes(HALF, HALF, HALF, 1, HALF)  # FSDP casts the parameters and the inputs: all 16-bit


# ---------------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds at its peak (the start of the backward of its last in-flight micro-batch)."""

    pp_rank: int
    stages: tuple[int, ...]
    blocks: int  # transformer blocks on this rank
    param_numel: int  # this rank's parameter elements (local shards)
    param_tensors: int
    params: int  # on the device (0 when FSDP offloads them to the host)
    grads: int
    optimizer: int
    activations: int  # saved for backward, all micro-batches in flight
    in_flight: int  # micro-batches (stage-chunks for looped schedules) whose activations are held
    buffers: int
    host: int  # parameters, gradients and optimizer state offloaded to host memory (parallel.cpu_offload)
    parts: dict[str, int] = field(default_factory=dict)  # named parts of activations and buffers

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def model_state(self) -> int:
        """Parameters + gradients + optimizer state wherever they live (device or host)."""
        return self.params + self.grads + self.optimizer + self.host


def rank_param_specs(
    model: GPTConfig | ViTConfig, stages: list[int], n_stages: int
) -> tuple[list[ParamSpec], list[ParamSpec], int]:
    """(root parameters, one block's parameters, blocks) on a rank holding ``stages``: the root is what
    FSDP's root unit holds (embeddings, final norm, head), the blocks are one FSDP unit each."""
    root: list[ParamSpec] = []
    if 0 in stages:
        root += input_params(model)
    if n_stages - 1 in stages:
        root += output_params(model)
    return root, list(block_params(model)), len(stages) * (model.n_layers // n_stages)


@dataclass(frozen=True)
class ModelState:
    """Elements of one rank's local parameter and gradient tensors (TP shard, then FSDP chunk)."""

    param_numel: int
    grad_numel: int
    tensors: int


def model_state_numel(cfg: Config, lay: Layout, pp_rank: int, shard_rank: int = 0) -> ModelState:
    """The local shards of pipeline rank ``pp_rank`` at FSDP shard ``shard_rank``.

    Gradients are shaped like their parameters except one: under tensor parallelism without FSDP, DTensor's
    backward of the vocabulary-split embedding lookup yields a replicated gradient, the whole V × d table on
    every rank (FSDP reduce-scatters it to the shard; tied to the LM head, the head's sharded gradient comes
    first and the embedding's is added into it).
    """
    d = lay.degrees
    stages = rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    root, block, n_blocks = rank_param_specs(cfg.model, stages, lay.n_stages)
    shards = d.dp_shard if lay.sharded else 1
    root_numel = sum(local_numel(s, d.tp, shards, shard_rank) for s in root)
    numel = root_numel + n_blocks * sum(local_numel(s, d.tp, shards, shard_rank) for s in block)
    grad_numel = numel
    model = cfg.model
    if (
        d.tp > 1
        and not lay.sharded
        and isinstance(model, GPTConfig)
        and not model.tie_embeddings
        and 0 in stages
    ):
        table = input_params(model)[0]  # tok_emb
        grad_numel += math.prod(table.shape) - local_numel(table, d.tp, 1, 0)
    return ModelState(numel, grad_numel, len(root) + n_blocks * len(block))


def unsharded_numel(cfg: Config, lay: Layout, pp_rank: int) -> int:
    """Parameter elements of a rank before FSDP sharding (after TP): what its all-gathers assemble."""
    d = lay.degrees
    stages = rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    root, block, n_blocks = rank_param_specs(cfg.model, stages, lay.n_stages)
    return _unsharded_numel(root, d.tp) + n_blocks * _unsharded_numel(block, d.tp)


def _unsharded_numel(specs: list[ParamSpec], tp: int) -> int:
    return sum(local_numel(s, tp, 1, 0) for s in specs)


def optimizer_bytes(cfg: Config, numel: int, tensors: int) -> int:
    """AdamW: exp_avg and exp_avg_sq like each parameter (fp32) and a 4-byte fp32 ``step`` per tensor (on the
    host for CUDA parameters unless fused/capturable); SGD: one momentum buffer when momentum > 0."""
    if cfg.optim.name == "adamw":
        return 2 * FP32 * numel + FP32 * tensors
    return FP32 * numel if cfg.optim.momentum > 0 else 0


def block_activation_bytes(model: GPTConfig | ViTConfig, lay: Layout, ac: str | None = None) -> int:
    """Bytes one block saves for its backward, per micro-batch on one rank.

    Without checkpointing (``hpctrain.models.layers.Block``; N tokens, width d, MLP ratio r, H heads):
    LayerNorm 1 saves its input x and two [N] statistics (mean, rstd: fp32); q, k, v save their common input
    (the LayerNorm output; under TP gathered whole, as DTensor's column-wise split needs it; autocast saves
    a 16-bit copy per linear); scaled_dot_product_attention (flash / memory-efficient kernels) saves q, k,
    v, its output (also the input of o) and an fp32 log-sum-exp [N·H]; LayerNorm 2 its input and
    statistics; fc_in its input; GELU its input (fc_in's output, r·d wide); fc_out its input (GELU's
    output). Dropout with p = 0 saves nothing (else a byte per element). That is (8 + 2r)·N·d elements plus
    statistics: 16·N·d
    for r = 4, Korthikanti et al.'s 34·s·b·h bytes less the dropout masks and attention scores the fused
    kernels do not keep. Tensor parallelism divides the head and MLP parts by tp; sequence parallelism
    also the residual stream and the statistics.

    ``full`` keeps only the block's input (``torch.utils.checkpoint``). ``selective``
    (``hpctrain.parallel.checkpointing``) keeps the input and the outputs of the matmuls and the attention
    kernel (and the sequence-parallel reduce-scatters), recomputing the rest: row-wise (o, fc_out) outputs
    are whole [N, d] partial sums under TP.
    """
    ac = lay.ac if ac is None else ac
    dt = dtypes(lay.regime)
    tp, seq = lay.degrees.tp, lay.seq_shards
    n, d, r, heads = lay.n_tokens, model.d_model, model.mlp_ratio, model.n_heads
    block_input = n * d // seq * dt.residual
    if ac == "full":
        return block_input
    qkv = 3 * n * d // tp * dt.matmul_out
    attention_out = n * d // tp * dt.matmul_out
    log_sum_exp = n * heads // tp * FP32
    if ac == "selective":
        rowwise_outputs = 2 * n * d * dt.matmul_out  # o and fc_out
        reduce_scatters = 2 * n * d // tp * dt.matmul_out if seq > 1 else 0
        return (
            block_input
            + qkv
            + attention_out
            + log_sum_exp
            + r * n * d // tp * dt.matmul_out
            + rowwise_outputs
            + reduce_scatters
        )
    norms = 2 * block_input + 2 * 2 * (n // seq) * FP32
    linear_inputs = (dt.qkv_input_copies + 1) * n * d * dt.matmul_in
    mlp = 2 * r * n * d // tp * dt.matmul_out
    # Dropout after o and after fc_out keeps a 1-byte mask of its [N, d] output (CUDA's fused dropout;
    # attention dropout inside the fused kernels keeps only an RNG offset).
    masks = 2 * n * d // seq if model.dropout > 0 else 0
    return norms + linear_inputs + qkv + attention_out + log_sum_exp + mlp + masks


def in_flight(schedule: str, pp: int, pp_rank: int, microbatches: int, per_rank: int) -> int:
    """Micro-batches (stage-chunks under looped schedules) whose activations a pipeline rank holds at once.

    GPipe runs every forward before any backward: all m. 1F1B (PipeDream-Flush; Narayanan et al. 2021,
    section 2.2) warms up with pp − r − 1 forwards on rank r, then alternates: pp − r. torch's looped
    schedules warm up (v − 1)·pp + 2·(pp − 1 − r) chunk forwards (``ScheduleInterleaved1F1B``), one more
    before the first backward; the zero-bubble variants are counted the same way.
    """
    if pp <= 1:
        return 1
    if schedule == "gpipe":
        return microbatches
    if schedule == "1f1b":
        return min(microbatches, pp - pp_rank)
    return min(microbatches * per_rank, (per_rank - 1) * pp + 2 * (pp - 1 - pp_rank) + 1)


def activation_parts(cfg: Config, lay: Layout, pp_rank: int) -> tuple[dict[str, int], int]:
    """Named parts of the activations one rank holds at its peak, and the micro-batches in flight."""
    model, d = cfg.model, lay.degrees
    dt = dtypes(lay.regime)
    stages = rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    first, last = 0 in stages, lay.n_stages - 1 in stages
    flying = in_flight(cfg.parallel.schedule, d.pp, pp_rank, lay.microbatches, lay.per_rank)
    blocks_per_stage = model.n_layers // lay.n_stages
    n, width = lay.n_tokens, model.d_model
    stream = n * width // lay.seq_shards * dt.residual  # one [N, d] residual-stream tensor (SP: its shard)
    pass_samples = lay.micro_batch * lay.microbatches  # the batch tensor one pass hands the model
    parts: dict[str, int] = {}
    parts["blocks"] = flying * blocks_per_stage * block_activation_bytes(model, lay)
    if d.pp > 1:
        # A later stage's input is its persistent receive buffer (counted under buffers), not a new tensor;
        # an earlier stage keeps its output for its backward (torch.distributed.pipelining's fwd_cache).
        later = sum(1 for s in stages if s != 0) / len(stages)
        earlier = sum(1 for s in stages if s != lay.n_stages - 1) / len(stages)
        parts["blocks"] -= round(flying * later * stream)
        parts["stage outputs"] = round(flying * earlier * stream)
    loss_flying = lay.microbatches if cfg.parallel.schedule == "gpipe" else 1
    if first and model.dropout > 0:  # the embedding dropout's mask, per micro-batch in flight
        parts["input"] = min(flying, lay.microbatches) * n * width
    if isinstance(model, GPTConfig):
        if first:
            # The token ids (saved by the embedding's backward) and the positions.
            parts["input"] = parts.get("input", 0) + pass_samples * lay.tokens * INT64 + lay.tokens * INT64
            if d.tp > 1:  # the vocabulary-split lookup saves its shifted, masked ids and the mask
                parts["input"] += min(flying, lay.microbatches) * n * (INT64 + 1)
        if last:
            final_norm = stream + 2 * (n // lay.seq_shards) * FP32
            head_input = n * width * dt.matmul_in  # gathered whole under TP
            log_probs = n * model.vocab_size * FP32  # the loss runs in fp32 (trainer.loss_of)
            parts["head and loss"] = loss_flying * (final_norm + head_input + log_probs + FP32)
            parts["head and loss"] += pass_samples * lay.tokens * INT64  # targets
            if d.pp > 1:
                # The schedule keeps every micro-batch's output (the logits) until the step ends.
                parts["pipeline outputs"] = lay.microbatches * n * model.vocab_size * dt.logits
    else:
        image = model.in_channels * model.image_size**2
        if first:
            parts["input"] = parts.get("input", 0) + pass_samples * image * FP32
            if lay.regime != "fp32":  # the patch conv saves its 16-bit copy of the images
                parts["input"] += min(flying, lay.microbatches) * lay.micro_batch * image * HALF
        if last:
            whole = n * width * dt.residual  # the final norm sees the whole sequence (gathered under SP)
            final_norm = whole + 2 * n * FP32
            # The head reads the class token of the normed sequence: the view keeps the whole [N, d] tensor,
            # except under autocast, which saves its 16-bit copy of the [B, d] slice.
            head_input = (
                lay.micro_batch * width * HALF if lay.regime == "autocast" else n * width * dt.residual
            )
            log_probs = lay.micro_batch * model.num_classes * FP32
            parts["head and loss"] = loss_flying * (final_norm + head_input + log_probs + FP32)
            parts["head and loss"] += pass_samples * INT64
            if d.pp > 1:
                parts["pipeline outputs"] = lay.microbatches * lay.micro_batch * model.num_classes * dt.logits
    return {k: v for k, v in parts.items() if v}, flying


def rank_memory(cfg: Config, lay: Layout, pp_rank: int) -> RankMemory:
    """The memory of pipeline rank ``pp_rank`` at its first data-parallel (and any tensor-parallel)
    coordinate: FSDP's first shard rank holds the most (⌈n / dp_shard⌉ rows of every tensor)."""
    p, model, d = cfg.parallel, cfg.model, lay.degrees
    stages = rank_stages(p.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    state = model_state_numel(cfg, lay, pp_rank)
    numel = state.param_numel
    params, grads = FP32 * numel, FP32 * state.grad_numel
    optimizer = optimizer_bytes(cfg, numel, state.tensors)
    acts, flying = activation_parts(cfg, lay, pp_rank)
    dt = dtypes(lay.regime)
    buffers: dict[str, int] = {}
    n, width = lay.n_tokens, model.d_model
    stream = n * width // lay.seq_shards * dt.residual
    root, block, n_blocks = rank_param_specs(model, stages, lay.n_stages)
    if d.dp_replicate > 1 and not lay.sharded:  # DDP
        buffers["DDP buckets"] = round(2 * p.bucket_cap_mb * MIB)  # one reducing, one filling (or compressed)
        if not p.gradient_as_bucket_view:
            buffers["DDP buckets"] += grads  # the buckets are a second copy of the gradients
        if p.compression in ("powersgd", "topk"):
            buffers["compression error feedback"] = grads  # what was not sent, kept per parameter
    if lay.sharded:
        param_bytes = HALF if lay.regime == "fsdp_mixed" else FP32
        whole_block = _unsharded_numel(block, d.tp)
        whole_root = _unsharded_numel(root, d.tp)
        if d.pp > 1:
            # torch.distributed.pipelining turns off FSDP's resharding after backward and its gradient
            # reduction for all but the last micro-batch: once a block has run a backward it stays gathered,
            # and its unreduced gradient accumulates whole (in the fp32 reduce dtype) until the step's end.
            buffers["FSDP gathered parameters"] = (n_blocks * whole_block + whole_root) * param_bytes
            buffers["FSDP unreduced gradients"] = (n_blocks * whole_block + whole_root) * FP32
        else:
            # ZeRO-3: the block running and the next one, prefetched; ZeRO-2 keeps every block gathered
            # from its forward to its backward. The root unit (embeddings, head) is not resharded after the
            # forward.
            gathered = min(2 if p.reshard_after_forward else n_blocks, n_blocks)
            buffers["FSDP gathered parameters"] = (gathered * whole_block + whole_root) * param_bytes
        # The unsharded gradients of the block being reduced and of the one being computed, in the
        # parameters' dtype (under the pipeline they are the unreduced gradients above), and the flat fp32
        # reduce-scatter input.
        computed = 2 * whole_block * param_bytes if d.pp == 1 else 0
        buffers["FSDP reduce-scatter"] = computed + whole_block * FP32
    if d.tp > 1:
        buffers["TP/SP collectives"] = 2 * n * width * dt.matmul_out  # a gathered input and a partial output
    if lay.regime == "autocast":
        specs = [s for s in [*root, *block] if s.autocast_copy]
        copies = sum(local_numel(s, d.tp, 1, 0) for s in specs if s in root)
        copies += n_blocks * sum(local_numel(s, d.tp, 1, 0) for s in specs if s in block)
        buffers["autocast weight copies"] = copies * HALF
    if d.pp > 1:
        receivers = sum(1 for s in stages if s != 0)
        senders = sum(1 for s in stages if s != lay.n_stages - 1)
        # torch.distributed.pipelining allocates one activation (and one gradient) receive buffer per
        # micro-batch, for the whole run.
        buffers["pipeline receive buffers"] = lay.microbatches * (receivers + senders) * stream
    if lay.n_stages - 1 in stages:
        vocab = model.vocab_size if isinstance(model, GPTConfig) else model.num_classes
        rows = n if isinstance(model, GPTConfig) else lay.micro_batch
        # The loss's backward: the gradients of the fp32 log-probabilities and of the logits.
        buffers["loss gradients"] = rows * vocab * (FP32 + dt.logits)
    if lay.ac != "none":
        # The block being recomputed in the backward holds what it would have kept without checkpointing.
        buffers["recomputed block"] = block_activation_bytes(model, lay, "none") - block_activation_bytes(
            model, lay
        )
    host = 0
    if p.cpu_offload and lay.sharded:
        host, params, grads, optimizer = params + grads + optimizer, 0, 0, 0
    return RankMemory(
        pp_rank=pp_rank,
        stages=tuple(stages),
        blocks=n_blocks,
        param_numel=numel,
        param_tensors=state.tensors,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=sum(acts.values()),
        in_flight=flying,
        buffers=sum(buffers.values()),
        host=host,
        parts={**acts, **buffers},
    )


# ------------------------------------------------------------------------------------------------ time
@dataclass(frozen=True)
class Comm:
    """One kind of communication of a step, per rank."""

    name: str
    bytes: float  # sent per rank per step
    seconds: float | None  # at the group's bandwidth (None: bandwidth unknown)
    exposed_s: float | None  # what is not hidden behind compute
    link: str  # NVLink | InfiniBand | "" (unknown)


@dataclass(frozen=True)
class StepTime:
    flops_per_step: float  # model FLOPs of one optimizer step, all ranks (6N + 12·L·H·Q·T per token)
    executed_flops: float  # with the recomputation of full activation checkpointing
    compute_s: float  # per rank at the achievable MFU
    bubble: float  # fraction of the step a pipeline rank idles
    comms: tuple[Comm, ...]
    step_s: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float  # model FLOPs / (step time × ranks × peak)
    gpu_hours: float  # for trainer.max_steps
    cost: float | None  # gpu_hours × cluster.cost_per_gpu_hour


def ranks_per_node(cfg: Config) -> int:
    c = cfg.cluster
    return c.nproc if c.kind == "local" else c.tasks_per_node


def group_bandwidth(cfg: Config, size: int, stride: int) -> tuple[float | None, str]:
    """Bus bandwidth (bytes/s) of one group of the mesh, whose ranks are ``stride`` apart.

    Ranks fill nodes in order (the mesh is pp × dp_replicate × dp_shard × tp, tp innermost). A group inside a
    node uses NVLink. One that spans nodes is bound by the nodes' network links, which every group of that
    mesh dimension on a node shares at once: a group with k ranks per node gets k / ranks-per-node of it
    (a ring over whole nodes gets all of it, as in nccl-tests).
    """
    c = cfg.cluster
    per_node = ranks_per_node(cfg)
    members = 1 if stride >= per_node else min(size, per_node // stride)
    if size <= members:
        if c.intra_node_gbps is None:
            return None, "NVLink"
        return c.intra_node_gbps * 1e9 / 8 * COMM_EFFICIENCY, "NVLink"
    if c.inter_node_gbps is None:
        return None, "InfiniBand"
    return c.inter_node_gbps * 1e9 / 8 * COMM_EFFICIENCY * members / per_node, "InfiniBand"


def _comm(cfg: Config, name: str, volume: float, size: int, stride: int, hidden_behind: float) -> Comm:
    bandwidth, link = group_bandwidth(cfg, size, stride)
    if bandwidth is None:
        return Comm(name, volume, None, None, link)
    seconds = volume / bandwidth
    return Comm(name, volume, seconds, max(0.0, seconds - hidden_behind), link)


def communication(cfg: Config, lay: Layout, mem: RankMemory, compute_s: float) -> list[Comm]:
    """What one rank sends per step, by strategy (ring collectives: all-reduce 2(n−1)/n × size, all-gather
    and reduce-scatter (n−1)/n × size, each size being the whole tensor the group assembles)."""
    p, model, d = cfg.parallel, cfg.model, lay.degrees
    dt = dtypes(lay.regime)
    comms: list[Comm] = []
    whole = unsharded_numel(cfg, lay, mem.pp_rank)
    forward_passes = lay.passes * lay.microbatches
    tp_stride, shard_stride = 1, d.tp
    replicate_stride, pp_stride = d.tp * d.dp_shard, d.tp * d.dp
    if d.dp_replicate > 1 and not lay.sharded:
        n = d.dp_replicate
        grad_bytes = whole * FP32
        # fp16/bf16 hooks halve the bytes. Top-k all-gathers k fp32 values and int64 indices per rank:
        # (n − 1)·12·ratio bytes per element against the all-reduce's 2(n − 1)/n·4. PowerSGD all-reduces
        # P (a × r) and Q (b × r) for each a × b matrix: r(a + b)/(ab), about 2r/d for square blocks.
        factor = {"fp16": 0.5, "bf16": 0.5, "topk": 1.5 * p.topk_ratio * n}.get(p.compression, 1.0)
        if p.compression == "powersgd":
            factor = 2 * p.powersgd_rank / model.d_model
        volume = 2 * (n - 1) / n * grad_bytes * factor
        # DDP all-reduces each bucket as soon as its gradients are ready: it overlaps the backward.
        comms.append(_comm(cfg, "DDP all-reduce", volume, n, replicate_stride, BACKWARD_SHARE * compute_s))
    if lay.sharded:
        n = d.dp_shard
        param_bytes = HALF if lay.regime == "fsdp_mixed" else FP32
        if d.pp > 1:
            # Under the pipeline a block stays gathered after its backward (see rank_memory): gathered once
            # for the first forward, then again for each backward under ZeRO-3; reduced once per pass.
            gathers = lay.passes * (1 + lay.microbatches if p.reshard_after_forward else 1)
        else:
            gathers = (2 if p.reshard_after_forward else 1) * forward_passes
        reduces = lay.passes
        gather = gathers * (n - 1) / n * whole * param_bytes
        reduce = reduces * (n - 1) / n * whole * FP32
        # FSDP2 prefetches the next block's all-gather during this block's compute, and reduce-scatters
        # during the backward: all of it can hide behind compute.
        fsdp = _comm(cfg, "FSDP all-gather + reduce-scatter", gather + reduce, n, shard_stride, compute_s)
        comms.append(fsdp)
        if d.dp_replicate > 1:
            # HSDP then all-reduces each shard over the replicas, in the backward too: it hides in what
            # compute the FSDP traffic left over.
            r = d.dp_replicate
            volume = lay.passes * 2 * (r - 1) / r * whole / n * FP32
            window = max(0.0, compute_s - (fsdp.seconds or 0.0))
            comms.append(_comm(cfg, "HSDP all-reduce", volume, r, replicate_stride, window))
    if d.tp > 1:
        n, width = lay.n_tokens, model.d_model
        # Megatron: two all-reduces of [N, d] per block in the forward and two in the backward (with SP the
        # same bytes as all-gather / reduce-scatter pairs); recomputation repeats the forward's.
        per_block = 4 + {"full": 2, "selective": 1 if lay.seq_shards > 1 else 2}.get(lay.ac, 0)
        all_reduces = mem.blocks * per_block
        volume = all_reduces * 2 * (d.tp - 1) / d.tp * n * width * dt.matmul_out
        if isinstance(model, GPTConfig):
            # The vocabulary-split embedding's all-reduce and the head input's gradient; the logits gathered.
            volume += 2 * 2 * (d.tp - 1) / d.tp * n * width * dt.matmul_out
            volume += (d.tp - 1) / d.tp * n * model.vocab_size * dt.logits
        comms.append(_comm(cfg, "TP collectives", volume * forward_passes, d.tp, tp_stride, 0.0))
    if d.pp > 1:
        stream = lay.n_tokens * model.d_model // lay.seq_shards * dt.residual
        boundaries = sum(1 for s in mem.stages if s != lay.n_stages - 1) + sum(
            1 for s in mem.stages if s != 0
        )
        volume = forward_passes * boundaries * stream  # activations forward, their gradients backward
        comms.append(_comm(cfg, "PP send/receive", volume, d.pp, pp_stride, 0.0))
    return comms


def pipeline_bubble(schedule: str, pp: int, microbatches: int, per_rank: int) -> float:
    """Fraction of a pipelined step spent idle: (pp − 1)/(m + pp − 1) for GPipe and 1F1B; the looped
    schedules divide the bubble by their stages per rank (Narayanan et al. 2021, section 2.2.2)."""
    if pp <= 1:
        return 0.0
    bubble = (pp - 1) / (per_rank if schedule in LOOPED_SCHEDULES else 1)
    return bubble / (microbatches + bubble)


def step_time(cfg: Config, lay: Layout, mem: RankMemory) -> StepTime | None:
    """None when the cluster's peak FLOP/s is unknown (CPU profiles)."""
    c = cfg.cluster
    if not c.peak_flops:
        return None
    samples = global_batch_size(cfg)
    tokens = samples * lay.tokens
    model_flops = flops_per_token(cfg.model) * tokens
    # Full checkpointing runs each block's forward again in the backward: one third more (the forward is 2
    # of the 6 FLOPs per parameter per token). Selective recomputes only element-wise work.
    executed = model_flops * (4 / 3 if lay.ac == "full" else 1.0)
    ranks = world_size(cfg)
    compute_s = executed / ranks / (c.peak_flops * c.achievable_mfu)
    if lay.ac == "selective":
        compute_s *= 1 + SELECTIVE_RECOMPUTE
    comms = communication(cfg, lay, mem, compute_s)
    blocking = sum(x.exposed_s or 0.0 for x in comms if x.name.startswith(("TP", "PP")))
    hidden = sum(x.exposed_s or 0.0 for x in comms if not x.name.startswith(("TP", "PP")))
    bubble = pipeline_bubble(cfg.parallel.schedule, lay.degrees.pp, lay.microbatches, lay.per_rank)
    step_s = (compute_s + blocking) / (1 - bubble) + hidden
    gpu_hours = step_s * cfg.trainer.max_steps * ranks / 3600
    return StepTime(
        flops_per_step=model_flops,
        executed_flops=executed,
        compute_s=compute_s,
        bubble=bubble,
        comms=tuple(comms),
        step_s=step_s,
        samples_per_s=samples / step_s,
        tokens_per_s=tokens / step_s,
        mfu=model_flops / (step_s * ranks * c.peak_flops),
        gpu_hours=gpu_hours,
        cost=gpu_hours * c.cost_per_gpu_hour if c.cost_per_gpu_hour is not None else None,
    )


# --------------------------------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Verdict:
    """Does the largest rank fit? ``kind``: gpu (GPU memory), host (host memory per process, from
    ``cluster.mem``) or none (nothing to compare with)."""

    kind: str
    capacity: int  # bytes per GPU, or per process
    reserve: int  # kept free (CUDA context and fragmentation; 0 for host memory)
    need: int
    fits: bool

    @property
    def usable(self) -> int:
        return self.capacity - self.reserve

    @property
    def margin(self) -> int:
        """Bytes left (negative: missing) after the reserve."""
        return self.usable - self.need

    @property
    def margin_pct(self) -> float:
        return 100.0 * self.margin / self.capacity if self.capacity else 0.0


_SLURM_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)


def slurm_mem_bytes(text: str | None) -> int | None:
    """Bytes of a Slurm ``--mem`` value (default unit MiB), None when absent or 0 (all of the node's)."""
    if text is None:
        return None
    match = _SLURM_MEM.match(text.strip())
    if not match:
        return None
    unit = {"": MIB, "K": 2**10, "M": MIB, "G": GIB, "T": 2**40}[match.group(2).upper()]
    value = int(float(match.group(1)) * unit)
    return value or None


def verdict(cfg: Config, mem: RankMemory) -> Verdict:
    c = cfg.cluster
    if c.gpus_per_node > 0 and c.gpu_memory_gib > 0:
        capacity = int(c.gpu_memory_gib * GIB)
        reserve = int(CUDA_CONTEXT_GIB * GIB + FRAGMENTATION * capacity)
        return Verdict("gpu", capacity, reserve, mem.total, mem.total <= capacity - reserve)
    node = slurm_mem_bytes(c.mem) if c.kind == "slurm" else None
    need = mem.total + mem.host
    if c.gpus_per_node == 0 and node:
        per_process = node // max(1, c.tasks_per_node)
        return Verdict("host", per_process, 0, need, need <= per_process)
    return Verdict("none", 0, 0, need, True)


# ------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Estimate:
    """Everything ``hpctrain plan`` prints about one config."""

    model: str  # e.g. "gpt"
    n_params: int  # distinct trainable parameters of the whole model
    world: int
    layout: Layout
    ranks: tuple[RankMemory, ...]  # one per pipeline rank (first data-parallel coordinate)
    largest: RankMemory
    verdict: Verdict
    time: StepTime | None


def check_plan_inputs(cfg: Config) -> None:
    """The cluster's planning fields (validated here: they are only read here)."""
    c = cfg.cluster
    if c.gpu_memory_gib < 0:
        raise ConfigError("cluster.gpu_memory_gib", c.gpu_memory_gib, "must be ≥ 0 (0: no GPU)")
    if not 0.0 < c.achievable_mfu <= 1.0:
        raise ConfigError("cluster.achievable_mfu", c.achievable_mfu, "must be in (0, 1]", valid="e.g. 0.45")
    for key in ("intra_node_gbps", "inter_node_gbps", "peak_flops", "cost_per_gpu_hour"):
        value = getattr(c, key)
        if value is not None and value <= 0:
            raise ConfigError(f"cluster.{key}", value, "must be > 0", valid="a positive number, or null")


def estimate(cfg: Config) -> Estimate:
    """The plan of a validated config (``hpctrain.config.validate.validate``)."""
    check_plan_inputs(cfg)
    lay = layout_of(cfg)
    ranks = tuple(rank_memory(cfg, lay, r) for r in range(lay.degrees.pp))
    largest = max(ranks, key=lambda m: (m.total, m.model_state))
    return Estimate(
        model=cfg.model.arch,
        n_params=param_count(cfg.model),
        world=world_size(cfg),
        layout=lay,
        ranks=ranks,
        largest=largest,
        verdict=verdict(cfg, largest),
        time=step_time(cfg, lay, largest),
    )


def gib(n: float) -> float:
    return n / GIB


def human_count(n: float) -> str:
    """1234567 → 1.2M, 6.4e9 → 6.4B."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n:.0f}"
