"""A model's blocks (hpctrain.parallel.blocks): found, named, or refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hpctrain.errors import ConfigError
from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.blocks import find_blocks, replace_block


def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))


def test_blocks_are_the_largest_module_list_or_the_named_classes():
    gpt = GPT(GPTSpec(n_layers=3, d_model=32, n_heads=2, vocab_size=64, seq_len=16))
    assert [b.module for b in find_blocks(gpt)] == list(gpt.layers.values())
    hf = tiny_gpt2()
    assert [b.module for b in find_blocks(hf)] == list(hf.transformer.h)
    assert [b.name for b in find_blocks(hf, ["GPT2Block"])] == ["transformer.h.0", "transformer.h.1"]
    assert find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []  # no container: no blocks


def test_a_block_class_that_matches_nothing_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^parallel.block_classes=GPT2Layer: no module of this class in"
    ) as err:
        find_blocks(tiny_gpt2(), ["GPT2Layer"])
    assert "GPT2Block" in str(err.value) and "\n" not in str(err.value)


def test_replacing_a_block_keeps_parameter_names():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    hf = tiny_gpt2()
    before = set(hf.state_dict())
    for block in find_blocks(hf):
        replace_block(block, checkpoint_wrapper(block.module))
    assert set(hf.state_dict()) == before
    out = hf(input_ids=torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long))
    out.loss.backward()  # the wrapped blocks still run forward and backward


def test_tp_and_pp_of_a_model_without_plans_are_one_line():
    from hpctrain.parallel.pipeline import split_stage

    with pytest.raises(
        ConfigError, match=r"^parallel.pp=2: model GPT2LMHeadModel declares no pipeline split"
    ):
        split_stage(tiny_gpt2(), 0, 2)
