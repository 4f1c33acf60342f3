"""torch.compile per block (hpctrain.parallel.compile): each block compiled in place, parameter names (and so
checkpoints) unchanged. Nothing is run: a cold compile takes 10-18 s on 2 cores (the layouts with
parallel.compile=true run in tests/e2e/parallel/test_layouts.py's parity table)."""

from __future__ import annotations

from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.compile import apply_compile


def test_each_block_is_compiled_in_place_with_its_names() -> None:
    model = GPT(GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16))
    names = list(model.state_dict())
    apply_compile(model)
    assert all(block._compiled_call_impl is not None for block in model.layers.values())
    assert model._compiled_call_impl is None and model.norm._compiled_call_impl is None  # blocks only
    assert list(model.state_dict()) == names
