"""DDP gradient compression hooks (hpctrain.parallel.compression) on real 2-process gloo groups (loopback),
against single-process training. (The bucket cap alone: tests/unit/parallel/test_compression.py.)

One spawn runs every check (start-up dominates the runtime); each rank saves what it saw and the tests below
assert on it. The workers live at module level so that spawn can pickle them.
"""

from __future__ import annotations

import faulthandler
import io
import math
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from hpctrain.launch.local import free_port
from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.parallel.compression import (
    CompressionState,
    TopKCompressionState,
    register_compression,
    single_bucket_cap_mb,
)
from hpctrain.verify.local_group import start_ranks

WORLD = 2
STEPS = 10
GLOBAL_BATCH = 8  # sequences; rank r trains on rows [4r, 4r + 4)
MODEL = GPTConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64, seq_len=16)
TOPK_RATIO = 0.1
TOPK_BUCKET_MB = 0.02  # ≈ 20 kB: the model's ≈ 110 kB of gradients fall into several buckets
POWERSGD = {"powersgd_rank": 1, "powersgd_start_step": 2}
HOOKS = ("none", "fp16", "bf16", "powersgd", "topk")

# Error-feedback check: a model whose gradient is its input, 8 entries in two parameters, k = ⌈0.25·8⌉ = 2.
EF_GRAD = {0: [8.0, -7.0, 6.0, 5.0, 1.0, 2.0, 3.0, 4.0], 1: [0.5, 1.0, 1.5, 2.0, -2.5, 3.0, 3.5, 4.0]}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, MODEL.vocab_size, (GLOBAL_BATCH, MODEL.seq_len + 1), generator=_gen(1234))
    return tokens[:, :-1], tokens[:, 1:]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model(MODEL)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, global_loss: Any) -> list[float]:
    """STEPS AdamW steps; the losses of every step, then the loss after the last one (STEPS + 1 values)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(STEPS):
        loss = _loss(model, x, y)
        losses.append(global_loss(loss))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        losses.append(global_loss(_loss(model, x, y)))
    return losses


def _mean_over_ranks(loss: torch.Tensor) -> float:
    # Equal halves of the global batch: the global mean loss is the mean of the ranks' means.
    value = loss.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.AVG)
    return float(value)


def _ddp(model: nn.Module, compression: str) -> DistributedDataParallel:
    if compression == "powersgd":
        cap = single_bucket_cap_mb(model)
    elif compression == "topk":
        cap = TOPK_BUCKET_MB
    else:
        cap = 25.0
    return DistributedDataParallel(model, bucket_cap_mb=cap)


def _register(ddp: DistributedDataParallel, compression: str) -> CompressionState:
    return register_compression(ddp, compression, topk_ratio=TOPK_RATIO, **POWERSGD)


def _flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _powersgd_fields(state: dict[str, Any]) -> dict[str, Any]:
    blob = torch.load(io.BytesIO(state["saved"]), weights_only=True)  # never a pickle: weights-only
    blob["rng"] = blob["rng"][1].numpy()  # the Mersenne Twister key, comparable with ==
    return blob


def _compressed_run(rank: int, compression: str, x: torch.Tensor, y: torch.Tensor, ckpt: Path) -> dict:
    """Train with the hook; for hooks with state, also checkpoint it, restore it into a fresh DDP and check
    that the restored run computes the same next gradients as the uninterrupted one."""
    model = _model()
    ddp = _ddp(model, compression)
    state = _register(ddp, compression)
    out: dict[str, Any] = {"losses": _train(ddp, x, y, _mean_over_ranks), "params": _flat_params(model)}
    out["state_type"] = type(state).__name__
    out["state_keys"] = sorted(state.state_dict())
    if compression not in ("powersgd", "topk"):
        return out
    if isinstance(state, TopKCompressionState):
        out["topk_buckets"] = len(state.layouts)

    # Direct round trip into a fresh state.
    saved = state.state_dict()
    fresh_state = _register(DistributedDataParallel(_model(), bucket_cap_mb=25.0), compression)
    fresh_state.load_state_dict(pickle.loads(pickle.dumps(saved)))
    out["saved"], out["roundtrip"] = saved, fresh_state.state_dict()

    # Through DCP, as the trainer checkpoints it: a per-rank directory, loaded into a restored run (a fresh
    # DDP on the trained weights, its buckets settled by a throwaway backward of a zero loss, then the state).
    dcp.save({"compression": state}, checkpoint_id=ckpt / f"rank{rank}", no_dist=True)
    restored_model = _model()
    restored_model.load_state_dict(model.state_dict())
    restored = _ddp(restored_model, compression)
    restored_state = _register(restored, compression)
    (_loss(restored, x, y) * 0.0).backward()
    restored.zero_grad(set_to_none=True)
    dcp.load({"compression": restored_state}, checkpoint_id=ckpt / f"rank{rank}", no_dist=True)
    out["dcp"] = restored_state.state_dict()
    for net in (ddp, restored):
        net.zero_grad(set_to_none=True)
        _loss(net, x, y).backward()
    out["next_grads"] = [torch.cat([p.grad.reshape(-1) for p in net.parameters()]) for net in (ddp, restored)]
    return out


class _GradIsInput(nn.Module):
    """loss = w1·x[:4] + w2·x[4:], so the gradient is x itself: exact values to follow through the hook."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.zeros(4))
        self.w2 = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w1 * x[:4]).sum() + (self.w2 * x[4:]).sum()


def _error_feedback_run(rank: int) -> dict:
    model = _GradIsInput()
    ddp = DistributedDataParallel(model)
    state = register_compression(ddp, "topk", topk_ratio=0.25, powersgd_rank=1, powersgd_start_step=2)
    assert isinstance(state, TopKCompressionState)
    out: dict[str, list] = {"grads": [], "residuals": [], "layouts": []}
    for _ in range(2):
        ddp.zero_grad(set_to_none=True)
        ddp(torch.tensor(EF_GRAD[rank])).backward()
        out["grads"].append(torch.cat([model.w1.grad, model.w2.grad]))
        residual = state.state_dict()["residual"]
        out["residuals"].append(torch.cat([residual["w1"], residual["w2"]]).clone())
        out["layouts"].append(state.layouts[0])
    return out


def _refusals() -> dict[str, str]:
    """What register_compression refuses, by the ValueError it raised ("" if none)."""
    cases = {
        # PowerSGD on gloo with a bucket cap that splits the gradients.
        "powersgd_buckets": ("powersgd", TOPK_BUCKET_MB, POWERSGD),
        # torch needs a plain step before PowerSGD's error feedback and warm start.
        "powersgd_start": ("powersgd", 25.0, {**POWERSGD, "powersgd_start_step": 1}),
        "unknown": ("gzip", 25.0, POWERSGD),
    }
    messages = {}
    for case, (compression, cap, powersgd) in cases.items():
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=cap)
        try:
            register_compression(ddp, compression, topk_ratio=TOPK_RATIO, **powersgd)
            messages[case] = ""
        except ValueError as error:
            messages[case] = str(error)
    return messages


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(120, exit=True)  # a hang shows where, instead of stalling pytest
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        x, y = _batch()
        half = GLOBAL_BATCH // WORLD
        mine = slice(rank * half, (rank + 1) * half)
        results: dict[str, Any] = {}
        if rank == 0:
            results["reference"] = _train(_model(), x, y, lambda loss: float(loss))
        for compression in HOOKS:
            ckpt = Path(out_dir) / compression
            results[compression] = _compressed_run(rank, compression, x[mine], y[mine], ckpt)
        results["error_feedback"] = _error_feedback_run(rank)
        results["refusals"] = _refusals()
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = tmp_path_factory.mktemp("compression")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # two ranks on two cores: no oversubscription by OpenMP
        start_ranks(_worker, WORLD, free_port("127.0.0.1"), str(out_dir))
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _assert_replicas_identical(ranks: list[dict[str, Any]], compression: str) -> None:
    params = [r[compression]["params"] for r in ranks]
    assert all(torch.equal(params[0], p) for p in params[1:]), f"{compression}: replicas diverged"


def test_uncompressed_ddp_matches_single_process(ranks: list[dict[str, Any]]) -> None:
    # The baseline the compressed runs are judged against: plain DDP is the single-process run.
    reference = ranks[0]["reference"]
    assert ranks[0]["none"]["losses"] == pytest.approx(reference, rel=1e-5)
    assert ranks[0]["none"]["state_keys"] == []
    _assert_replicas_identical(ranks, "none")


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_half_precision_hooks_track_the_reference(ranks: list[dict[str, Any]], compression: str) -> None:
    reference = ranks[0]["reference"]
    losses = ranks[0][compression]["losses"]
    assert losses[-1] == pytest.approx(reference[-1], rel=1e-2)
    assert losses[-1] < 0.9 * losses[0]  # it trained
    assert ranks[0][compression]["state_type"] == "CompressionState"
    assert ranks[0][compression]["state_keys"] == []
    _assert_replicas_identical(ranks, compression)


@pytest.mark.parametrize("compression", ["powersgd", "topk"])
def test_lossy_hooks_train_and_keep_replicas_identical(ranks: list[dict[str, Any]], compression: str) -> None:
    losses = ranks[0][compression]["losses"]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[STEPS - 1] < 0.9 * losses[0], losses
    assert losses[-1] < 0.9 * losses[0], losses
    _assert_replicas_identical(ranks, compression)


def test_topk_ran_over_several_buckets(ranks: list[dict[str, Any]]) -> None:
    assert ranks[0]["topk"]["topk_buckets"] > 1


def test_topk_error_feedback_values(ranks: list[dict[str, Any]]) -> None:
    # Step 1: rank 0 sends entries 0, 1 (|8|, |-7|), rank 1 entries 7, 6 (4, 3.5); the gradient is their sum
    # over ranks / 2, and each rank keeps the rest: residual = (g + 0) minus the sent entries.
    # Step 2, same gradient again: acc = g + residual doubles the unsent entries, so rank 0 now sends 2 and 3
    # (12, 10) and rank 1 sends 5 and 4 (6, -5), entries that lost in step 1.
    expected_grads = [
        [4.0, -3.5, 0.0, 0.0, 0.0, 0.0, 1.75, 2.0],
        [0.0, 0.0, 6.0, 5.0, -2.5, 3.0, 0.0, 0.0],
    ]
    expected_residuals = {
        0: [[0.0, 0.0, 6.0, 5.0, 1.0, 2.0, 3.0, 4.0], [8.0, -7.0, 0.0, 0.0, 2.0, 4.0, 6.0, 8.0]],
        1: [[0.5, 1.0, 1.5, 2.0, -2.5, 3.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 3.5, 4.0]],
    }
    for rank, result in enumerate(ranks):
        ef = result["error_feedback"]
        for step in range(2):
            where = f"rank {rank}, step {step + 1}"
            assert torch.equal(ef["grads"][step], torch.tensor(expected_grads[step])), where
            assert torch.equal(ef["residuals"][step], torch.tensor(expected_residuals[rank][step])), where
        # DDP rebuilt its one bucket between the steps with the parameters in the other order: the residual
        # followed its parameters, not the bucket offsets.
        assert ef["layouts"] == [("w1", "w2"), ("w2", "w1")]


@pytest.mark.parametrize("compression", ["powersgd", "topk"])
def test_state_round_trip_is_exact(ranks: list[dict[str, Any]], compression: str) -> None:
    for result in ranks:
        run = result[compression]
        for restored in (run["roundtrip"], run["dcp"]):
            if compression == "topk":
                saved, got = run["saved"]["residual"], restored["residual"]
                assert set(saved) == set(got)
                assert all(torch.equal(saved[name], got[name]) for name in saved)
                assert any(bool(t.any()) for t in saved.values())  # something was left unsent
            else:
                saved, got = _powersgd_fields(run["saved"]), _powersgd_fields(restored)
                assert saved["iter"] == got["iter"] == STEPS
                assert (saved["rng"] == got["rng"]).all()
                for field in ("error_dict", "p_memory_dict", "q_memory_dict"):
                    assert saved[field].keys() == got[field].keys() == {0}
                    assert all(torch.equal(saved[field][i], got[field][i]) for i in saved[field])
        # The restored run computes the next step's gradient bit for bit as the uninterrupted one.
        uninterrupted, resumed = run["next_grads"]
        assert torch.equal(uninterrupted, resumed)


def test_refusals(ranks: list[dict[str, Any]]) -> None:
    refused = ranks[0]["refusals"]
    assert "one DDP bucket" in refused["powersgd_buckets"]
    assert "single_bucket_cap_mb" in refused["powersgd_buckets"]
    assert "at least 2" in refused["powersgd_start"]
    assert "gzip" in refused["unknown"]
