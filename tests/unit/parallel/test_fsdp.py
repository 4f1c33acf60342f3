"""FSDP2 (hpctrain.parallel.fsdp) on one rank: every block its own unit, the root the rest; parameters become
DTensors, and a step computes the plain model's gradients; bf16 all-gathers in bf16 and reduces in fp32."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule

from hpctrain.config.schema import ParallelConfig
from hpctrain.models.builtin import GPTSpec
from hpctrain.models.gpt import GPT
from hpctrain.parallel.fsdp import apply_fsdp

SPEC = GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)


def dp_mesh() -> DeviceMesh:
    """The data-parallel mesh of the one rank."""
    return init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))


def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def test_blocks_and_root_are_sharded_and_train_like_the_plain_model(
    fsdp_copy: Callable[[torch.nn.Module], torch.nn.Module],
) -> None:
    torch.manual_seed(0)
    plain = GPT(SPEC)
    sharded = fsdp_copy(plain)
    assert isinstance(sharded, FSDPModule) and all(isinstance(b, FSDPModule) for b in sharded.layers.values())
    assert not isinstance(sharded.norm, FSDPModule)  # the root unit holds what is not a block
    assert all(type(p).__name__ == "DTensor" for p in sharded.parameters())
    assert sharded.state_dict().keys() == plain.state_dict().keys()
    tokens = torch.randint(0, SPEC.vocab_size, (2, SPEC.seq_len + 1))
    expected, got = _loss(plain, tokens), _loss(sharded, tokens)
    torch.testing.assert_close(got, expected)
    expected.backward()
    got.backward()
    grads = dict(sharded.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad.full_tensor(), p.grad)


def test_bf16_gathers_in_bf16_and_keeps_fp32_masters(one_rank: torch.device) -> None:
    model = GPT(SPEC)
    apply_fsdp(
        model, init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",)), ParallelConfig(), "bf16", one_rank
    )
    logits = model(torch.randint(0, SPEC.vocab_size, (2, 8)))
    assert logits.dtype == torch.bfloat16  # the forward ran in the gathered bf16 parameters
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the sharded master copy
