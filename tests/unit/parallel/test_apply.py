"""The parallelize step (hpctrain.parallel.apply) in one process: one process keeps the plain model, with
activation checkpointing applied where asked; DDP on one rank, and the throwaway step that settles its buckets
leaves weights, gradients and RNG streams as they were."""

from __future__ import annotations

import copy

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.compose import compose, to_typed
from hpctrain.models import build_model
from hpctrain.parallel.apply import apply_ddp, parallelize, prime_ddp_buckets

ONE = ["model=gpt", "model.n_layers=2", "parallel=none", "cluster.nproc=1"]


def test_one_process_keeps_the_plain_model() -> None:
    cfg = to_typed(compose([*ONE, "parallel.activation_checkpointing=full", "trainer.precision=bf16"]))
    model = build_model(cfg.model)
    names = list(model.state_dict())
    result = parallelize(model, cfg, torch.device("cpu"))
    assert result.model is model and result.parts == [model] and result.pipeline is None
    assert result.dims.mesh is None and result.whole_grads and result.data_parallel == (0, 1)
    assert result.regime == "autocast" and result.compression is None
    assert result.saved_names == {"head.weight": "tok_emb.weight"}  # the tied head is saved once
    assert all(isinstance(block, CheckpointWrapper) for block in model.layers.values())
    assert list(model.state_dict()) == names


def test_ddp_on_one_rank_and_its_bucket_priming_changes_nothing(one_rank: torch.device) -> None:
    cfg = to_typed(compose(ONE))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    before = copy.deepcopy(model.state_dict())
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_replicate",))
    ddp, compression = apply_ddp(model, cfg.parallel, one_rank, mesh)
    assert isinstance(ddp, DistributedDataParallel) and ddp.module is model
    assert compression.state_dict() == {}  # no compression hook
    tokens = torch.randint(0, 256, (2, 9))
    rng = torch.get_rng_state()
    prime_ddp_buckets(ddp, lambda m: m(tokens[:, :-1]).float().mean())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert ddp.training
