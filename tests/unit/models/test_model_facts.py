"""hpctrain.models.facts and the built-ins' declared fact sheets (TransformerSpec.facts): the sheet lists the
real model's parameters, tensor by tensor, with the facts the planner reads."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec, ViTSpec
from hpctrain.models.facts import Activations, Linear, Measured, ModelFacts, ParamFact, TransformerShape

GPT = GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
VIT = ViTSpec(n_layers=2, d_model=32, n_heads=4, image_size=8, patch_size=2, in_channels=3, num_classes=7)
SPECS = [GPT, replace(GPT, tie_embeddings=False), replace(GPT, n_layers=4, mlp_ratio=2), VIT]


def _linear_inputs(model: nn.Module) -> set[str]:
    """Parameters read by a linear or convolution (whose 16-bit copies autocast caches)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        names[id(p)]
        for m in model.modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
        for p in m.parameters(recurse=False)
    }


@pytest.mark.parametrize("spec", SPECS, ids=["gpt", "gpt-untied", "gpt-4-layers", "vit"])
def test_the_declared_sheet_is_the_real_models_parameters(spec: GPTSpec | ViTSpec):
    facts = spec.facts()
    model = build_model(spec)
    real = {n: tuple(p.shape) for n, p in model.named_parameters()}  # tied weights once
    assert {q.name: q.shape for q in facts.params} == real
    assert facts.n_params == spec.param_count() == sum(p.numel() for p in model.parameters())
    assert {q.name for q in facts.params if q.autocast_copy} == _linear_inputs(model)
    assert all(q.itemsize == 4 and q.stages == (0,) for q in facts.params)
    # FSDP units: the blocks, layers.k being unit k; the rest the root.
    for q in facts.params:
        assert q.unit == (int(q.name.split(".")[1]) if q.name.startswith("layers.") else -1), q.name
    assert facts.blocks == spec.n_layers and isinstance(facts.activations, TransformerShape)
    assert facts.tokens_per_sample == spec.tokens_per_sample
    assert facts.training_flops(3) == spec.flops_per_token() * 3 * spec.tokens_per_sample


def test_pipeline_stages_tied_copies_and_the_vocabulary_split_gradient():
    one, two = GPT.facts(1), GPT.facts(2)
    by_name = {q.name: q for q in two.params}
    assert by_name["tok_emb.weight"].stages == (0,) and by_name["norm.weight"].stages == (1,)
    assert by_name["layers.0.ln1.weight"].stages == (0,) and by_name["layers.1.ln1.weight"].stages == (1,)
    # Tied: the last stage holds its own copy of the embedding for the LM head, not a distinct parameter.
    head = by_name["head.weight"]
    assert head.copy and head.stages == (1,) and head.shape == (64, 32)
    assert two.n_params == one.n_params == GPT.param_count()
    assert "head.weight" not in {q.name for q in one.params}
    # The vocabulary-split lookup's gradient is whole under TP, unless the head tied to it on its stage
    # computes the split gradient first (one stage, tied).
    assert not {q.name: q for q in one.params}["tok_emb.weight"].whole_grad_under_tp
    assert by_name["tok_emb.weight"].whole_grad_under_tp
    untied = {q.name: q for q in replace(GPT, tie_embeddings=False).facts(1).params}
    assert untied["tok_emb.weight"].whole_grad_under_tp and not untied["head.weight"].copy
    assert not any(q.whole_grad_under_tp for q in VIT.facts(2).params)
    # Layers beyond an even split are on no stage (the layout check refuses such a split).
    assert {q.stages for q in replace(GPT, n_layers=3).facts(2).params if q.unit == 2} == {()}


def test_what_each_built_in_declares_beside_its_code():
    gpt, vit = GPT.ends(), VIT.ends()
    assert (gpt.input_numel, gpt.input_itemsize, gpt.input_float) == (16, 8, False)
    assert (gpt.head_positions, gpt.head_width, gpt.vocab_parallel) == (16, 64, True)
    assert (vit.input_numel, vit.input_itemsize, vit.input_float) == (3 * 8 * 8, 4, True)
    assert (vit.head_positions, vit.head_width, vit.vocab_parallel) == (1, 7, False)
    assert vit.norm_gathers_sequence and not gpt.norm_gathers_sequence
    assert (GPT.throughput_unit, VIT.throughput_unit) == ("tokens", "samples")
    assert GPT.facts().throughput_unit == "tokens"
    assert GPT.facts().powersgd_share(2) == 2 * 2 / 32  # d × d blocks


def _measured(params: tuple[ParamFact, ...], **changes: object) -> ModelFacts:
    line = Linear(10.0, 5.0)
    lines = (Activations("fp32", line, line, line),)
    facts = ModelFacts("mine.Net", params, 0, 0, None, Measured((2, 4), lines, input_kind="images"))
    return replace(facts, **changes)


def test_a_measured_sheet():
    params = (ParamFact("w", (6, 4), 4), ParamFact("b", (6,), 4), ParamFact("h", (3, 4), 2))
    facts = _measured(params)
    assert facts.n_params == 24 + 6 + 12 and facts.param_bytes == 4 * 30 + 2 * 12
    # PowerSGD sends r(a + b) of each a × b matrix (at most the matrix), vectors whole.
    assert facts.powersgd_share(1) == pytest.approx((10 + 6 + 7) / 42)
    assert facts.powersgd_share(4) == 1.0
    # FLOPs: counted when measured, else 6·N per position (per sample when positions are unknown).
    assert facts.training_flops(2) == 6.0 * 42 * 2
    assert replace(facts, tokens_per_sample=8).training_flops(2) == 6.0 * 42 * 8 * 2
    assert replace(facts, flops_per_sample=100.0).training_flops(2) == 200.0
    assert facts.describe_input() == ", takes images"
    tokens = replace(facts, tokens_per_sample=8, activations=Measured(input_kind="tokens"))
    assert tokens.describe_input() == ", 8 tokens per sample"
    assert facts.measured is not None and facts.activations_in("autocast") is not None
    assert GPT.facts().measured is None and GPT.facts().activations_in("fp32") is None
    assert torch.get_default_dtype() == torch.float32
