"""The planner's accounting of issue 31, against the real models where they can be counted: a mixture of
experts' total and active parameters, expert parallelism's split of the experts, LoRA's trained state (the
real adapted model's trainable parameters), context parallelism's share of the activations and its ring,
and the communication each adds. In-process."""

from __future__ import annotations

import torch

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.config.validate import validate
from hpctrain.models import build_model
from hpctrain.models.adapters import add_lora
from hpctrain.plan.activations import model_parallel_volumes
from hpctrain.plan.layout import declared_facts, layout_of
from hpctrain.plan.memory import rank_memory

MOE = ("model=gpt_moe", "model.moe.experts=4", "model.moe.top_k=2")


def typed(*overrides: str) -> Config:
    cfg = to_typed(compose(list(overrides)))
    validate(cfg)
    return cfg


def test_a_mixture_of_experts_counts_total_and_active_parameters_as_the_model_has_them() -> None:
    cfg = typed(*MOE, "parallel=none", "cluster.nproc=1")
    facts = declared_facts(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model)
    assert facts.n_params == sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    # A token uses the router and top_k = 2 of the 4 experts.
    assert facts.n_active == facts.n_params - experts // 2


def test_expert_parallelism_splits_the_experts_over_ep_and_shards_the_rest_over_every_rank() -> None:
    alone = typed(*MOE, "parallel=fsdp", "cluster.nproc=4")  # dp_shard 4
    ep = typed(*MOE, "parallel=fsdp", "parallel.ep=2", "cluster.nproc=4")  # dp_shard 2 × ep 2
    facts = declared_facts(alone)
    a, b = (rank_memory(c, layout_of(c), 0, facts) for c in (alone, ep))
    # Dense weights over 4 ranks either way; the experts over ep 2 then FSDP over the 2 holding the same:
    # a quarter each, as under plain FSDP (the rows of 4-divisible shapes split evenly).
    assert a.param_numel == b.param_numel
    assert "EP all-to-all" in b.parts and "EP all-to-all" not in a.parts
    volumes = model_parallel_volumes(layout_of(ep), facts, b.blocks, b.stages)
    # Dispatch + combine of the k·N rows, forward and backward, half of them to the other rank.
    lay = layout_of(ep)
    assert volumes["EP all-to-all"] == 2 * 4 * 0.5 * 2 * lay.n_tokens * 64 * 4


def test_lora_trains_the_adapters_only() -> None:
    cfg = typed("model=gpt", "model.adapters=lora", "model.lora.rank=4", "parallel=none", "cluster.nproc=1")
    facts = declared_facts(cfg)
    with torch.device("meta"):
        model = build_model(cfg.model)
    add_lora(model, cfg.model.lora)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert facts.n_trainable == trained and facts.n_params == sum(p.numel() for p in model.parameters())
    mem = rank_memory(cfg, layout_of(cfg), 0, facts)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    assert mem.grads == 4 * trained
    assert mem.optimizer == 2 * 4 * trained + 4 * tensors  # AdamW's two moments and a step per tensor
    plain = typed("model=gpt", "parallel=none", "cluster.nproc=1")
    assert mem.params == rank_memory(plain, layout_of(plain), 0).params + 4 * trained


def test_fsdp_reduce_scatters_only_what_trains_under_lora() -> None:
    """FSDP2 reduces the gradients there are: a LoRA run's reduce-scatter buffer is its largest block's
    adapters (unsharded gradients in fp32 twice, and the fp32 flat input), not the frozen block."""
    lora = ("model=gpt", "model.adapters=lora", "model.lora.rank=4", "parallel=fsdp", "cluster.nproc=2")
    cfg, plain = typed(*lora), typed("model=gpt", "parallel=fsdp", "cluster.nproc=2")
    with torch.device("meta"):
        model = build_model(cfg.model)
    add_lora(model, cfg.model.lora)
    block = [p for n, p in model.named_parameters() if n.startswith("layers.0.")]
    trained = sum(p.numel() for p in block if p.requires_grad)
    mem, full = rank_memory(cfg, layout_of(cfg), 0), rank_memory(plain, layout_of(plain), 0)
    assert mem.parts["FSDP reduce-scatter"] == trained * (2 * 4 + 4)
    frozen = sum(p.numel() for p in block if not p.requires_grad)
    assert full.parts["FSDP reduce-scatter"] == frozen * (2 * 4 + 4)  # the same block, all of it training


def test_context_parallelism_halves_the_blocks_activations_and_adds_its_ring() -> None:
    seq = ("model=gpt", "model.seq_len=1024", "trainer.micro_batch_size=4", "trainer.global_batch_size=8")
    one = typed(*seq, "parallel=fsdp", "cluster.nproc=2")
    cp = typed(*seq, "parallel=cp", "cluster.nproc=2", "trainer.global_batch_size=4")
    a, b = (rank_memory(c, layout_of(c), 0) for c in (one, cp))
    assert layout_of(cp).n_tokens * 2 == layout_of(one).n_tokens
    assert b.parts["blocks"] * 2 == a.parts["blocks"]
    assert b.parts["CP ring attention"] > 0 and "CP ring attention" not in a.parts
    assert b.param_numel == a.param_numel  # FSDP over the cp ranks: the same shards
    volumes = model_parallel_volumes(layout_of(cp), declared_facts(cp), b.blocks, b.stages)
    kv = 2 * layout_of(cp).n_tokens * declared_facts(cp).activations.d_model  # type: ignore[union-attr]
    assert volumes["CP ring"] == b.blocks * (2 * kv * 4 + 2 * kv * 4)
