"""Memory per rank: model state, activations in flight and buffers, from the layout of each parameter.
Torch-free; the method and its sources are in :mod:`hpctrain.plan.estimate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpctrain.config.schema import Config
from hpctrain.models.spec import ParamSpec, TransformerSpec
from hpctrain.plan.layout import (
    FP32,
    HALF,
    INT64,
    MIB,
    Layout,
    local_numel,
    planned_model,
    rank_stages,
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
    model: TransformerSpec, stages: list[int], n_stages: int
) -> tuple[list[ParamSpec], list[ParamSpec], int]:
    """(root parameters, one block's parameters, blocks) on a rank holding ``stages``: the root is what
    FSDP's root unit holds (embeddings, final norm, head), the blocks are one FSDP unit each."""
    root: list[ParamSpec] = []
    if 0 in stages:
        root += model.input_params()
    if n_stages - 1 in stages:
        root += model.output_params()
        if n_stages > 1:  # a weight tied to the first stage's: the last stage holds a copy of its own
            root += model.output_copies()
    return root, list(model.block_param_specs()), len(stages) * (model.n_layers // n_stages)


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
    model = planned_model(cfg)
    root, block, n_blocks = rank_param_specs(model, stages, lay.n_stages)
    shards = d.dp_shard if lay.sharded else 1
    root_numel = sum(local_numel(s, d.tp, shards, shard_rank) for s in root)
    numel = root_numel + n_blocks * sum(local_numel(s, d.tp, shards, shard_rank) for s in block)
    grad_numel = numel
    if (
        d.tp > 1
        and not lay.sharded
        and model.input_kind == "tokens"
        and not (model.tied_embeddings and lay.n_stages == 1)  # tied, the head's split gradient comes first
        and 0 in stages
    ):
        table = model.input_params()[0]  # tok_emb
        grad_numel += math.prod(table.shape) - local_numel(table, d.tp, 1, 0)
    return ModelState(numel, grad_numel, len(root) + n_blocks * len(block))


def unsharded_numel(cfg: Config, lay: Layout, pp_rank: int) -> int:
    """Parameter elements of a rank before FSDP sharding (after TP): what its all-gathers assemble."""
    d = lay.degrees
    stages = rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    root, block, n_blocks = rank_param_specs(planned_model(cfg), stages, lay.n_stages)
    return _unsharded_numel(root, d.tp) + n_blocks * _unsharded_numel(block, d.tp)


def _unsharded_numel(specs: list[ParamSpec], tp: int) -> int:
    return sum(local_numel(s, tp, 1, 0) for s in specs)


def optimizer_bytes(cfg: Config, numel: int, tensors: int) -> int:
    """AdamW: exp_avg and exp_avg_sq like each parameter (fp32) and a 4-byte fp32 ``step`` per tensor (on the
    host for CUDA parameters unless fused/capturable); SGD: one momentum buffer when momentum > 0."""
    if cfg.optim.name == "adamw":
        return 2 * FP32 * numel + FP32 * tensors
    return FP32 * numel if cfg.optim.momentum > 0 else 0


def block_activation_bytes(model: TransformerSpec, lay: Layout, ac: str | None = None) -> int:
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
    (``hpctrain.parallel.recompute``) keeps the input and the outputs of the matmuls and the attention
    kernel (and the sequence-parallel reduce-scatters), recomputing the rest: row-wise (o, fc_out) outputs
    are whole [N, d] partial sums under TP.
    """
    ac = lay.ac if ac is None else ac
    dt = dtypes(lay.regime)
    tp, seq = lay.degrees.tp, lay.seq_shards
    n, d, r, heads = lay.n_tokens, model.d_model, model.mlp_ratio, model.n_heads
    # A rank's share of the sequence: padded to a multiple of the shards (hpctrain.parallel.tp).
    shard = lay.micro_batch * -(-lay.tokens // seq)
    block_input = shard * d * dt.residual
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
    norms = 2 * block_input + 2 * 2 * shard * FP32
    linear_inputs = (dt.qkv_input_copies + 1) * n * d * dt.matmul_in
    mlp = 2 * r * n * d // tp * dt.matmul_out
    # Dropout after o and after fc_out keeps a 1-byte mask of its [N, d] output (CUDA's fused dropout;
    # attention dropout inside the fused kernels keeps only an RNG offset).
    masks = 2 * shard * d if model.dropout > 0 else 0
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
    model, d = planned_model(cfg), lay.degrees
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
    if model.input_kind == "tokens":  # the token embedding's ids in, per-token logits out
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
    else:  # the patch convolution's images in, one row of class logits per sample out
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
    p, model, d = cfg.parallel, planned_model(cfg), lay.degrees
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
        tokens_in = model.input_kind == "tokens"
        vocab = model.vocab_size if tokens_in else model.num_classes
        rows = n if tokens_in else lay.micro_batch
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
