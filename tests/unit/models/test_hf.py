"""A transformers model's own pipeline split (hpctrain.models.hf), read on the meta device: the modules before
its layer list, the list, the modules after (its head included), and what every stage keeps; none for a
model that declares no plan."""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hpctrain.models.hf import pipeline_split


def test_a_llamas_declared_split() -> None:
    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    with torch.device("meta"):
        llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, **tiny))
    split = pipeline_split(llama)
    assert split is not None
    assert split.blocks == "model.layers" and isinstance(llama.get_submodule(split.blocks), nn.ModuleList)
    assert split.input == ("model.embed_tokens",)
    assert "model.norm" in split.output and "lm_head" in split.output
    assert split.keep == ("model.rotary_emb",)  # no parameters: every stage computes the rotary embeddings


def test_no_plan_no_split() -> None:
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, eos_token_id=0)
    with torch.device("meta"):
        gpt2 = GPT2LMHeadModel(config)
    assert getattr(gpt2.config, "base_model_pp_plan", None) is None  # GPT-2 declares none
    assert pipeline_split(gpt2) is None
    assert pipeline_split(nn.Sequential(nn.Linear(2, 2))) is None
