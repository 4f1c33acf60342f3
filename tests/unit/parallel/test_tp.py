"""Tensor parallelism (hpctrain.parallel.tp): where a model's plan comes from (``parallel.tp_plan``, the
class's ``TP_PLAN``, a transformers model's own), patterns resolved on the meta device, one line for a plan
that names nothing, each role's torch style; and on one rank the parallelized model computes what the plain
one does, its tied weights still one parameter."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
from transformers import LlamaConfig, LlamaForCausalLM

from hpctrain.config.schema import TP_ROLES
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.tp import apply_tp, pattern_modules, require_tp_plan, style_for, tp_plan_of

SPEC = GPTSpec(n_layers=3, d_model=32, n_heads=4, vocab_size=64, seq_len=16)


def meta_gpt() -> GPT:
    with torch.device("meta"):
        return GPT(SPEC)


def test_the_plan_comes_from_the_config_then_the_class_then_transformers() -> None:
    gpt = meta_gpt()
    assert tp_plan_of(gpt) == (dict(GPT.TP_PLAN), "GPT.TP_PLAN")
    mine = {"layers.*.mlp.fc_in": "colwise", "layers.*.mlp.fc_out": "rowwise"}
    assert tp_plan_of(gpt, mine) == (mine, "parallel.tp_plan")
    assert tp_plan_of(nn.Sequential(nn.Linear(2, 2))) is None
    with torch.device("meta"):
        llama = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=64,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
            )
        )
    found = tp_plan_of(llama)
    assert found is not None
    plan, source = found
    assert source == "LlamaForCausalLM's base_model_tp_plan"
    assert set(plan.values()) <= set(TP_ROLES)  # transformers' role names translated to hpctrain's
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise" and plan["lm_head"] == "vocab_head"
    assert require_tp_plan(llama, None, 2) == plan  # every pattern names a module of the model


def test_patterns_resolve_one_level_per_star_on_the_meta_device() -> None:
    gpt = meta_gpt()
    assert pattern_modules(gpt, "layers.*.attn.q") == [gpt.layers[str(i)].attn.q for i in range(3)]
    assert pattern_modules(gpt, "layers.1.mlp.fc_in") == [gpt.layers["1"].mlp.fc_in]
    assert pattern_modules(gpt, "layers.*") == list(gpt.layers.values())
    assert pattern_modules(gpt, "layers.*.nosuch") == [] and pattern_modules(gpt, "nosuch") == []
    assert all(p.is_meta for p in gpt.parameters())  # resolved without allocating a weight


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        (None, "parallel.tp=2: model Sequential has no tensor-parallel plan: set parallel.tp_plan"),
        ({"0": "spread"}, "parallel.tp_plan[0]=spread: not a tensor-parallel role"),
        ({"layers.*.nosuch": "colwise"}, "parallel.tp_plan[layers.*.nosuch]=colwise: the pattern names no"),
    ],
)
def test_a_plan_that_cannot_be_applied_is_one_line(plan: dict[str, str] | None, words: str) -> None:
    model = nn.Sequential(nn.Linear(2, 2)) if plan is None else meta_gpt()
    with pytest.raises(ConfigError) as refused:
        require_tp_plan(model, plan, 2)
    assert str(refused.value).startswith(words) and "\n" not in str(refused.value)


def test_each_role_has_its_torch_style() -> None:
    assert isinstance(style_for("colwise", False), ColwiseParallel)
    replicated, sequence = style_for("rowwise", False), style_for("rowwise", True)
    assert isinstance(replicated, RowwiseParallel) and isinstance(sequence, RowwiseParallel)
    assert replicated.output_layouts == (Replicate(),) and sequence.output_layouts == (Shard(1),)
    assert isinstance(style_for("norm", True), SequenceParallel) and style_for("norm", False) is None
    for role in ("gather_sequence", "enter_sequence_shards", "replicated"):
        assert style_for(role, True) is None  # hooks do the sequence work, or nothing is split
    assert isinstance(style_for("vocab_head", True), ColwiseParallel)
    assert isinstance(style_for("vocab_embedding", False), RowwiseParallel)
    with pytest.raises(ValueError, match="unknown tensor-parallel role 'spread'"):
        style_for("spread", False)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_on_one_rank_the_parallelized_gpt_computes_what_the_plain_one_does(
    one_rank: torch.device, sequence_parallel: bool
) -> None:
    torch.manual_seed(0)
    plain = GPT(SPEC)
    ours = copy.deepcopy(plain)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    apply_tp(ours, mesh, sequence_parallel)
    assert ours.head.weight is ours.tok_emb.weight  # the tie survives: one parameter, not two
    assert type(ours.layers["0"].attn.q.weight).__name__ == "DTensor"
    tokens = torch.randint(0, SPEC.vocab_size, (2, 11))  # 11 positions: not a multiple of anything
    expected, got = plain(tokens), ours(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    got.sum().backward()
    assert ours.tok_emb.weight.grad is not None
