"""Precision decisions on CPU: which layers float8 takes, which regime and scaler each precision gets, why a
device cannot train in fp8; and torchao's conversion itself, run on CPU (float8 arithmetic emulated)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models.gpt import GPT
from hpctrain.parallel.apply import apply_float8
from hpctrain.precision import (
    allows_tf32,
    amp,
    compute_precision,
    float8_converts,
    float8_problem,
    regime,
    scales_loss,
)


def test_float8_takes_only_layers_large_enough_to_gain() -> None:
    # (out, in): GPT-2 124M's fc_in (3072 × 768) gains; its q/k/v/o (768²) and fc_out (768 × 3072) do not
    # (torchao's tensor-wise table: K ≤ 4096 and N ≤ 1024 is slower); a dimension not a multiple of 16 never.
    assert float8_converts(3072, 768)
    assert not float8_converts(768, 768)
    assert not float8_converts(768, 3072)
    assert float8_converts(4096, 4096)
    assert not float8_converts(50257, 768)
    assert not float8_converts(4104, 4100)


def test_fp8_trains_in_bf16s_regime_without_a_loss_scaler() -> None:
    assert regime("fp8", sharded=False) == "autocast" and regime("fp8", sharded=True) == "fsdp_mixed"
    assert compute_precision("fp8") == "bf16" and amp.dtype_of("fp8") == torch.bfloat16
    assert amp.fsdp_policy("fp8").param_dtype == torch.bfloat16
    assert [p for p in ("fp32", "bf16", "fp16", "fp8") if scales_loss(p)] == ["fp16"]
    assert [p for p in ("fp32", "bf16", "fp16", "fp8") if allows_tf32(p)] == ["bf16", "fp16", "fp8"]


def test_the_scaler_is_on_for_fp16_only_and_sharded_where_gradients_are() -> None:
    cpu = torch.device("cpu")
    for precision in ("fp32", "bf16", "fp8"):
        assert not amp.grad_scaler(cpu, precision, sharded_grads=False).is_enabled()
    assert amp.grad_scaler(cpu, "fp16", sharded_grads=False).is_enabled()
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    assert isinstance(amp.grad_scaler(cpu, "fp16", sharded_grads=True), ShardedGradScaler)
    assert not isinstance(amp.grad_scaler(cpu, "bf16", sharded_grads=True), ShardedGradScaler)


def test_float8_needs_a_capable_gpu_and_torchao() -> None:
    assert "this machine has none" in (float8_problem(None, True) or "")
    assert "this GPU is 8.0" in (float8_problem((8, 0), True) or "")  # A100: no float8 tensor cores
    assert "torchao" in (float8_problem((9, 0), False) or "")
    assert float8_problem((8, 9), True) is None and float8_problem((9, 0), True) is None
    # The worker's own check, on this machine's CPU: one line naming the key and what is valid.
    with pytest.raises(ConfigError) as refused:
        amp.require_float8(torch.device("cpu"))
    assert str(refused.value).startswith("trainer.precision=fp8: float8 training needs a CUDA GPU")
    assert "valid: fp32, bf16, fp16" in str(refused.value)


def _gpt() -> GPT:
    # d_model 384: each block's fc_in (1536 × 384) gains from float8, nothing else does.
    torch.manual_seed(0)
    return GPT(vocab_size=256, seq_len=16, n_layers=2, d_model=384, n_heads=4)


def test_float8_converts_the_blocks_layers_and_trains_on_cpu_emulated() -> None:
    reference, model = _gpt(), _gpt()
    names = list(model.state_dict())
    converted = apply_float8(model, emulate=True)
    assert converted == ["layers.0.mlp.fc_in", "layers.1.mlp.fc_in"]
    assert type(model.layers["0"].mlp.fc_in).__name__ == "Float8Linear"
    assert type(model.layers["0"].mlp.fc_out) is nn.Linear and type(model.head) is nn.Linear  # head: bf16
    # Same parameter names and values (checkpoints load either way), the tied head still tied.
    assert list(model.state_dict()) == names and model.head.weight is model.tok_emb.weight
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))

    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    losses = {}
    for name, m in (("bf16", reference), ("fp8", model)):
        with amp.autocast(torch.device("cpu"), name, "autocast"):
            loss = F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        losses[name] = float(loss.detach())
    # float8 rounds the fc_in matmuls' inputs to 3 mantissa bits: close to bf16's loss, not equal to it.
    assert losses["fp8"] != losses["bf16"] and abs(losses["fp8"] - losses["bf16"]) < 1e-2 * losses["bf16"]
    grad, ref = model.layers["0"].mlp.fc_in.weight.grad, reference.layers["0"].mlp.fc_in.weight.grad
    assert grad is not None and ref is not None
    assert float((grad - ref).norm() / ref.norm()) < 0.2


def test_float8_applies_to_any_model_from_outside() -> None:
    """A user's model: with a block list only its blocks' layers; without one, every layer that gains."""

    class Mixer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(2048, 2048)
            pairs = (nn.Sequential(nn.Linear(64, 2048), nn.Linear(2048, 64)) for _ in range(2))
            self.blocks = nn.ModuleList(pairs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.stem(x)

    assert apply_float8(Mixer(), emulate=True) == ["blocks.0.0", "blocks.1.0"]
    flat = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    assert apply_float8(flat, emulate=True) == ["0"]
    with torch.device("meta"):  # converting needs no memory and no GPU: a meta model converts too
        big = GPT(vocab_size=50304, seq_len=1024, n_layers=2, d_model=1024, n_heads=16)
    assert apply_float8(big) == ["layers.0.mlp.fc_in", "layers.1.mlp.fc_in"]
