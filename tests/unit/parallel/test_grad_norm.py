"""The global gradient norm and clipping (hpctrain.parallel.grad_norm): torch's own on plain gradients and
on DTensor (FSDP) ones alike, copies counted elsewhere left out, gradients scaled to the limit."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.grad_norm import clip_grad_norm_, global_grad_norm

SPEC = GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)


def dp_mesh() -> DeviceMesh:
    """The data-parallel mesh of the one rank."""
    return init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))


def _backward(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    torch.manual_seed(3)
    model(torch.randint(0, SPEC.vocab_size, (2, 8))).pow(2).mean().backward()
    return list(model.parameters())


def test_the_norm_is_torchs_and_clipping_scales_to_the_limit() -> None:
    torch.manual_seed(0)
    params = _backward(GPT(SPEC))
    reference = torch.nn.utils.get_total_norm([p.grad for p in params])
    torch.testing.assert_close(global_grad_norm(params, None), reference)
    head = params[-1]
    without = torch.sqrt(reference**2 - head.grad.pow(2).sum())
    torch.testing.assert_close(global_grad_norm(params, None, uncounted=[head]), without)
    before = clip_grad_norm_(params, max_norm=float(reference) / 4, pp_group=None)
    torch.testing.assert_close(before, reference)
    torch.testing.assert_close(global_grad_norm(params, None), reference / 4, rtol=1e-5, atol=0)
    unclipped = [p.grad.clone() for p in params]
    clip_grad_norm_(params, max_norm=0.0, pp_group=None)  # 0: only measure
    assert all(torch.equal(p.grad, g) for p, g in zip(params, unclipped, strict=True))


def test_dtensor_gradients_give_the_same_norm(
    fsdp_copy: Callable[[torch.nn.Module], torch.nn.Module],
) -> None:
    torch.manual_seed(0)
    plain = GPT(SPEC)
    sharded = fsdp_copy(plain)
    expected = global_grad_norm(_backward(plain), None)
    torch.testing.assert_close(global_grad_norm(_backward(sharded), None), expected)
