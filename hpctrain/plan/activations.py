"""What a rank keeps between the forward and the backward, from the fact sheet's activation source: a
declared transformer's per-block formulas, or the lines measured of a user's model. Torch-free; the method
and its sources are in :mod:`hpctrain.plan.estimate`.

Everything else of a rank's memory (model state, data-parallel buffers, offload) is counted the same way
for both sources, from the sheet's parameters (:mod:`hpctrain.plan.memory`); only what depends on the
tensors a model computes is here, with the tensors its model-parallel collectives move
(:func:`model_parallel_volumes`), which only the declared shapes give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.config.schema import Config
from hpctrain.models.facts import Measured, ModelFacts, TransformerShape
from hpctrain.plan.layout import FP32, HALF, INT64, Layout


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


@dataclass(frozen=True)
class Held:
    """A rank's activations at its peak and the buffers that come with them, by name."""

    activations: dict[str, int]
    buffers: dict[str, int] = field(default_factory=dict)


def applied_ac(lay: Layout, facts: ModelFacts) -> str:
    """The checkpointing that takes effect: none where no blocks were found to wrap."""
    return lay.ac if facts.blocks else "none"


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


def held(cfg: Config, lay: Layout, facts: ModelFacts, stages: list[int], blocks: int, flying: int) -> Held:
    """The activations of the rank holding pipeline ``stages`` and ``blocks`` of the model's blocks, with
    ``flying`` micro-batches in flight, and the buffers that depend on them."""
    if isinstance(facts.activations, TransformerShape):
        return _declared(cfg, lay, facts.activations, stages, flying, frozen_inputs(facts))
    return _measured(lay, facts, facts.activations, stages, blocks, flying)


# ------------------------------------------------------------------------------------- declared shapes
def frozen_inputs(facts: ModelFacts) -> frozenset[str]:
    """The Linear layers (of a block, by their name in it, or the head) whose input nothing saves: frozen,
    with no adapter (LoRA's base; a frozen weight needs no input for its gradient, and the gradient of
    the input needs the weight only)."""
    trains: dict[str, bool] = {}
    for q in facts.params:
        module, _, kind = q.name.rpartition(".")
        parts = module.split(".")
        if parts[0] == "layers" and len(parts) > 2:
            module = ".".join(parts[2:])
        owner = module.removesuffix(".lora_A").removesuffix(".lora_B")
        if kind == "weight":
            trains[owner] = trains.get(owner, False) or q.trainable
    return frozenset(name for name, trained in trains.items() if not trained)


def block_activation_bytes(
    model: TransformerShape, lay: Layout, ac: str | None = None, frozen: frozenset[str] = frozenset()
) -> int:
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

    ``frozen`` (:func:`frozen_inputs`): MLP Linear layers whose inputs are not saved (LoRA's frozen base:
    fc_in's input, the second LayerNorm's output; fc_out's, GELU's output).
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
    linear_inputs = (dt.qkv_input_copies + ("mlp.fc_in" not in frozen)) * n * d * dt.matmul_in
    mlp = (2 - ("mlp.fc_out" in frozen)) * r * n * d // tp * dt.matmul_out
    if getattr(model, "moe", None) is not None:  # a spec of a dense model has no such field
        mlp = moe_activation_bytes(model, lay)
    # Dropout after o and after fc_out keeps a 1-byte mask of its [N, d] output (CUDA's fused dropout;
    # attention dropout inside the fused kernels keeps only an RNG offset).
    masks = 2 * shard * d if model.dropout > 0 else 0
    return norms + linear_inputs + qkv + attention_out + log_sum_exp + mlp + masks


def moe_activation_bytes(model: TransformerShape, lay: Layout) -> int:
    """What a mixture of experts in place of the MLP saves per micro-batch (``hpctrain.models.moe.MoE``; it
    runs whole on the gathered sequence under tensor parallelism): the router's fp32 probabilities [N, E]
    and the top-k indices and gates, the k·N routed rows (each expert's input), each expert's GELU input
    and output (r·d wide per row) and the per-assignment outputs the gates weigh. An expert-parallel rank
    computes the rows its experts were sent: k·N on average."""
    assert model.moe is not None
    dt = dtypes(lay.regime)
    n, d, r = lay.n_tokens, model.d_model, model.mlp_ratio
    k, experts = model.moe.top_k, model.moe.experts
    router = n * experts * FP32 + n * k * (INT64 + FP32)
    rows = k * n * d * (dt.matmul_in + dt.matmul_out)  # routed inputs, per-assignment outputs
    return router + rows + 2 * r * k * n * d * dt.matmul_out


def context_buffers(model: TransformerShape, lay: Layout) -> int:
    """Ring attention's buffers (:mod:`hpctrain.parallel.context`) at their peak, the backward of one
    block: the stacked keys and values held and received, their fp32 gradients travelling the ring, and the
    fp32 score blocks of one query share against one key share (scores, probabilities, their gradient)."""
    dt = dtypes(lay.regime)
    n, d = lay.n_tokens, model.d_model
    kv = 2 * n * d
    scores = lay.micro_batch * model.n_heads * lay.tokens * lay.tokens * FP32
    return 2 * kv * dt.matmul_out + 2 * kv * FP32 + 3 * scores


def _declared(
    cfg: Config,
    lay: Layout,
    model: TransformerShape,
    stages: list[int],
    flying: int,
    frozen: frozenset[str] = frozenset(),
) -> Held:
    """The blocks' activations times the micro-batches in flight, the ends' (the model's :class:`Ends`),
    and the buffers of the tensors they move: TP/SP gathers, pipeline receive buffers, the loss's gradient,
    the block being recomputed."""
    d, ends = lay.degrees, model.ends
    dt = dtypes(lay.regime)
    first, last = 0 in stages, lay.n_stages - 1 in stages
    blocks_per_stage = model.n_layers // lay.n_stages
    n, width = lay.n_tokens, model.d_model
    stream = n * width // lay.seq_shards * dt.residual  # one [N, d] residual-stream tensor (SP: its shard)
    pass_samples = lay.micro_batch * lay.microbatches  # the batch tensor one pass hands the model
    parts: dict[str, int] = {}
    parts["blocks"] = flying * blocks_per_stage * block_activation_bytes(model, lay, frozen=frozen)
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
    # The rows of logits one micro-batch gives (context parallelism: of this rank's share of the positions).
    rows = lay.micro_batch * ends.head_positions // d.cp
    if first:
        # The batch as the data gives it (token ids saved by the embedding's backward, or the images) and
        # what is saved once per forward (the positions a learned-position lookup saves).
        batch = pass_samples * ends.input_numel * ends.input_itemsize + ends.input_fixed_bytes
        parts["input"] = parts.get("input", 0) + batch
        if ends.vocab_parallel and d.tp > 1:  # the vocabulary-split lookup saves its shifted ids and mask
            parts["input"] += min(flying, lay.microbatches) * n * (INT64 + 1)
        if ends.input_float and lay.regime != "fp32":  # the first layer saves its 16-bit copy of the input
            copy = lay.micro_batch * ends.input_numel * HALF
            parts["input"] += min(flying, lay.microbatches) * copy
    if last:
        # The final norm runs on the residual stream's shards, or on the whole gathered sequence.
        norm_shards = 1 if ends.norm_gathers_sequence else lay.seq_shards
        final_norm = n * width // norm_shards * dt.residual + 2 * (n // norm_shards) * FP32
        # The head's input: under autocast the 16-bit copy of the rows it reads; else the normed sequence
        # (gathered whole under TP; a head reading one position keeps the whole tensor its view is of).
        head_input = rows * width * HALF if lay.regime == "autocast" else n * width * dt.residual
        if "head" in frozen:  # a frozen head keeps no input for its weight's gradient
            head_input = 0
        log_probs = rows * ends.head_width * FP32  # the loss runs in fp32 (trainer.loss_of)
        parts["head and loss"] = loss_flying * (final_norm + head_input + log_probs + FP32)
        parts["head and loss"] += pass_samples * ends.head_positions * INT64  # targets
        if d.pp > 1:
            # The schedule keeps every micro-batch's output (the logits) until the step ends.
            parts["pipeline outputs"] = lay.microbatches * rows * ends.head_width * dt.logits
    buffers: dict[str, int] = {}
    if d.cp > 1:
        buffers["CP ring attention"] = context_buffers(model, lay)
    if d.ep > 1 and model.moe is not None:
        # The rows received for this rank's experts, regrouped by expert, and the results sent back.
        buffers["EP all-to-all"] = 3 * model.moe.top_k * n * width * dt.matmul_out
    if d.tp > 1:
        buffers["TP/SP collectives"] = 2 * n * width * dt.matmul_out  # a gathered input and a partial output
    if d.pp > 1:
        receivers = sum(1 for s in stages if s != 0)
        senders = sum(1 for s in stages if s != lay.n_stages - 1)
        # torch.distributed.pipelining allocates one activation (and one gradient) receive buffer per
        # micro-batch, for the whole run.
        buffers["pipeline receive buffers"] = lay.microbatches * (receivers + senders) * stream
    if last:
        # The loss's backward: the gradients of the fp32 log-probabilities and of the logits.
        buffers["loss gradients"] = rows * ends.head_width * (FP32 + dt.logits)
    if lay.ac != "none":
        # The block being recomputed in the backward holds what it would have kept without checkpointing.
        buffers["recomputed block"] = block_activation_bytes(model, lay, "none") - block_activation_bytes(
            model, lay
        )
    return Held({k: v for k, v in parts.items() if v}, buffers)


def model_parallel_volumes(
    lay: Layout, facts: ModelFacts, blocks: int, stages: tuple[int, ...]
) -> dict[str, float]:
    """Bytes one rank sends per step over its tensor-, context-, expert- and pipeline-parallel groups (the
    rank holding ``blocks`` blocks of ``stages``); counted from declared shapes only (a measured model's:
    none).

    Megatron: two all-reduces of [N, d] per block in the forward and two in the backward (with SP the same
    bytes as all-gather / reduce-scatter pairs); recomputation repeats the forward's. A pipeline sends each
    boundary's activations forward and their gradients backward."""
    model = facts.activations
    if not isinstance(model, TransformerShape):
        return {}
    d = lay.degrees
    dt = dtypes(lay.regime)
    forward_passes = lay.shape.forward_passes
    volumes: dict[str, float] = {}
    if d.tp > 1:
        n, width = lay.n_tokens, model.d_model
        per_block = 4 + {"full": 2, "selective": 1 if lay.seq_shards > 1 else 2}.get(lay.ac, 0)
        all_reduces = blocks * per_block
        volume = all_reduces * 2 * (d.tp - 1) / d.tp * n * width * dt.matmul_out
        if model.ends.vocab_parallel:
            # The vocabulary-split embedding's all-reduce and the head input's gradient; the logits gathered.
            volume += 2 * 2 * (d.tp - 1) / d.tp * n * width * dt.matmul_out
            volume += (d.tp - 1) / d.tp * n * model.ends.head_width * dt.logits
        volumes["TP collectives"] = volume * forward_passes
    recompute = 1 if lay.ac in ("full", "selective") else 0  # the forward's exchanges again
    if d.cp > 1:
        # Per block: the keys and values go cp − 1 hops in the forward (and again when recomputed) and in
        # the backward, where their fp32 gradients go cp hops.
        kv = 2 * lay.n_tokens * model.d_model
        per_block = (2 + recompute) * (d.cp - 1) * kv * dt.matmul_out + d.cp * kv * FP32
        volumes["CP ring"] = forward_passes * blocks * per_block
    if d.ep > 1 and model.moe is not None:
        # Per block: dispatch and combine of the k·N routed rows, (ep − 1)/ep of them to other ranks, in the
        # forward (again when recomputed) and reversed in the backward.
        rows = model.moe.top_k * lay.n_tokens * model.d_model * dt.matmul_out
        volumes["EP all-to-all"] = forward_passes * blocks * (4 + 2 * recompute) * (d.ep - 1) / d.ep * rows
    if d.pp > 1:
        stream = lay.n_tokens * model.d_model // lay.seq_shards * dt.residual
        boundaries = sum(1 for s in stages if s != lay.n_stages - 1) + sum(1 for s in stages if s != 0)
        volumes["PP send/receive"] = forward_passes * boundaries * stream
    return volumes


# -------------------------------------------------------------------------------------- measured lines
def _measured(
    lay: Layout,
    facts: ModelFacts,
    measured: Measured,
    stages: list[int],
    blocks_held: int,
    flying: int,
) -> Held:
    """The measured line (fixed + per sample) at ``trainer.micro_batch_size``, in the layout's precision
    regime, and the loss's gradients (the logits' bytes, and fp32 log-probabilities like them) as a buffer;
    under full checkpointing the measured bytes outside the blocks plus their inputs, and the block being
    recomputed as a buffer. Selective checkpointing of a user's block keeps the matmul outputs and
    recomputes the rest: not measured, the full measurement is its upper bound.

    Under tensor and pipeline parallelism the activations are split approximately: the blocks' measured
    part by the rank's share of the blocks and by tp, the ends' on the end stages, times the micro-batches
    in flight (and no TP/PP buffers are counted: the plan says so)."""
    d = lay.degrees
    ac = applied_ac(lay, facts)
    acts = measured.in_regime(lay.regime)
    parts: dict[str, int] = {}
    buffers: dict[str, int] = {}
    if acts is None:
        return Held(parts, buffers)
    mb = lay.micro_batch
    line = acts.checkpointed if ac == "full" else acts.saved
    if d.pp == 1 and d.tp == 1:
        parts["saved for backward"] = line.at(mb)
    else:
        share = blocks_held / facts.blocks if facts.blocks else 1.0
        ends = acts.outside.at(mb) if 0 in stages or lay.n_stages - 1 in stages else 0
        blocks = max(0, line.at(mb) - acts.outside.at(mb))
        parts["saved for backward"] = round(flying * (blocks * share / d.tp + ends))
    if ac == "full":
        buffers["recomputed block"] = round(acts.recompute.at(mb) / d.tp)
    if lay.n_stages - 1 in stages:
        # The loss's backward: the gradient of the logits (their dtype) and of its fp32 log-probabilities.
        logits = acts.output.at(mb)
        itemsize = FP32 if acts.regime == "fp32" else HALF
        buffers["loss gradients"] = logits + logits // itemsize * FP32
    return Held(parts, buffers)
