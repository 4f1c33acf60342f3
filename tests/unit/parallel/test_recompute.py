"""Activation checkpointing (hpctrain.parallel.recompute) in one process: every block wrapped, parameter names
unchanged, and the gradients those of the plain model, for ``full`` and ``selective`` alike."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.recompute import apply_activation_checkpointing

SPEC = GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16, dropout=0.1)


def _grads(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)  # the same dropout masks in both runs (the wrapper replays the RNG state)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_blocks_are_recomputed_with_the_same_gradients(mode: str) -> None:
    torch.manual_seed(0)
    plain = GPT(SPEC)
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped, mode)
    assert all(isinstance(block, CheckpointWrapper) for block in wrapped.layers.values())
    assert wrapped.state_dict().keys() == plain.state_dict().keys()  # checkpoints load under any layout
    tokens = torch.randint(0, SPEC.vocab_size, (3, SPEC.seq_len + 1))
    expected, got = _grads(plain, tokens), _grads(wrapped, tokens)
    assert expected.keys() == {name.replace("._checkpoint_wrapped_module", "") for name in got}
    for name, grad in got.items():
        torch.testing.assert_close(grad, expected[name.replace("._checkpoint_wrapped_module", "")])


def test_none_leaves_the_model_alone_and_an_unknown_mode_is_refused() -> None:
    model = GPT(SPEC)
    apply_activation_checkpointing(model, "none")
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())
    with pytest.raises(ValueError, match="unknown activation checkpointing mode 'some'"):
        apply_activation_checkpointing(model, "some")
