"""The CUDA path, on a real GPU: an NCCL group of one rank on the local rank's device, bf16 autocast without
a loss scaler and fp16 with one, async checkpoints staged into pinned host memory, the hang watchdog firing
while the host waits on the GPU, float8 layers, and peak memory against `hpctrain plan`'s estimate.

Every test here is marked ``gpu`` and skipped in one line on a machine without CUDA (CI's); bench/gpu.py
runs them (``python -m pytest -m gpu tests/gpu``). The decisions these paths follow are tested on CPU in
tests/unit (precision: scaler and regime; rendezvous: device_for; plan: fp8 pricing).
"""

from __future__ import annotations

import json
import socket
import statistics
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpctrain.checkpoint.staging import SegmentStager, Staged
from hpctrain.config.compose import compose, to_typed
from hpctrain.models.gpt import GPT
from hpctrain.parallel.apply import apply_float8
from hpctrain.plan.estimate import estimate
from hpctrain.precision import amp
from hpctrain.rendezvous.env import DistEnv
from hpctrain.rendezvous.group import init_distributed
from hpctrain.resilience import watchdog as wd
from tests.support import FAST, hpctrain, metrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]
# One tolerance for the planner on a GPU (the issue's): the estimate within 10% of the allocator's peak.
PLAN_TOLERANCE = 0.10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpt(device: str = "cuda") -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=256, seq_len=64, n_layers=2, d_model=256, n_heads=4).to(device)


def test_a_one_rank_nccl_group_on_the_local_ranks_gpu() -> None:
    env = DistEnv(0, 0, 1, 1, "127.0.0.1", _free_port(), socket.gethostname())
    device = init_distributed(env, timeout_s=60)
    try:
        assert (
            device == torch.device("cuda", 0) and torch.cuda.current_device() == 0
        )  # set_device(local rank)
        assert dist.get_backend() == "nccl"
        x = torch.full((4,), 3.0, device=device)
        dist.all_reduce(x)
        assert x.tolist() == [3.0] * 4
    finally:
        dist.destroy_process_group()


def test_bf16_autocasts_without_a_scaler_and_fp16_scales_its_loss() -> None:
    cuda = torch.device("cuda")
    x = torch.randint(0, 256, (4, 64), device=cuda)
    y = torch.roll(x, -1, dims=1)
    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model = _gpt()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = amp.grad_scaler(cuda, precision, sharded_grads=False)
        assert scaler.is_enabled() == (precision == "fp16")
        before = model.layers["0"].mlp.fc_in.weight.detach().clone()
        scales = []
        for _ in range(3):  # an fp16 step whose scaled gradients overflow is skipped and the scale halved
            with amp.autocast(cuda, precision, "autocast"):
                logits = model(x)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            assert logits.dtype == dtype and torch.isfinite(loss)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scales.append(scaler.get_scale() if scaler.is_enabled() else None)
        if precision == "fp16":  # 2^16 at first (torch's default), never above it within 2000 steps
            assert all(s is not None and 1.0 <= s <= 65536.0 for s in scales)
        else:
            assert scales == [None] * 3
        assert not torch.equal(before, model.layers["0"].mlp.fc_in.weight)


def test_async_checkpoints_stage_into_pinned_host_memory() -> None:
    model = _gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 64), device="cuda")).float().mean().backward()
    optimizer.step()
    stager = SegmentStager()
    stager.defer_until_step([optimizer])
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    copied: list[Staged] = []
    staged = stager.stage(state, is_coordinator=True, then=lambda done, err: copied.append(done))
    stager.wait_staged()
    assert copied == [staged] and staged.segment.device.type == "cpu" and staged.segment.is_pinned()

    def host(name: str) -> torch.Tensor:
        slot = staged.slots[name]
        return staged.segment[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)

    for name, source in state["model"].items():
        assert torch.equal(host(f"model.{name}"), source.cpu())
    for i, per_param in state["optim"]["state"].items():
        assert torch.equal(host(f"optim.state.{i}.exp_avg"), per_param["exp_avg"].cpu())
    stager.close()


def test_the_watchdog_fires_while_the_host_waits_on_a_hung_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired: list[float] = []
    monkeypatch.setattr(wd.Watchdog, "_fire", lambda self, age, limit: fired.append(age))
    monkeypatch.setattr(wd, "HEARTBEAT_S", 0.1)
    dog = wd.Watchdog(tmp_path, 0, socket.gethostname(), factor=2.0, min_s=0.3, on_hang=lambda *_: None)
    try:
        for _ in range(3):
            dog.step_done(0.01)  # a baseline: the limit is max(2 × median, 0.3 s)
        dog.enter(1, "compute")
        torch.cuda._sleep(int(3e9))  # a kernel spinning ~2 s (cycles at 1.5-2 GHz)
        torch.cuda.synchronize()  # the host blocks here, as a step blocks on a hung collective
        time.sleep(0.3)
        assert len(fired) == 1 and fired[0] > 0.3
    finally:
        dog.close()


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
    reason="no float8 tensor cores on this GPU (compute capability < 8.9)",
)
def test_float8_layers_train_on_the_gpu_beside_bf16() -> None:
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    reference = GPT(vocab_size=256, seq_len=128, n_layers=2, d_model=1024, n_heads=8).to(cuda)
    model = GPT(vocab_size=256, seq_len=128, n_layers=2, d_model=1024, n_heads=8).to(cuda)
    model.load_state_dict(reference.state_dict())
    amp.require_float8(cuda)
    assert apply_float8(model) == ["layers.0.mlp.fc_in", "layers.1.mlp.fc_in"]
    x = torch.randint(0, 256, (8, 128), device=cuda)
    y = torch.roll(x, -1, dims=1)
    losses = []
    for m in (reference, model):
        with amp.autocast(cuda, "fp8", "autocast"):
            loss = F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        losses.append(float(loss.detach()))
    assert abs(losses[1] - losses[0]) < 1e-2 * losses[0]


@pytest.mark.parametrize(("model", "micro_batch"), [("gpt2_124m", 8), ("gpt2_350m", 4)])
def test_peak_memory_is_within_10_percent_of_the_plan(run_dir: Path, model: str, micro_batch: int) -> None:
    overrides = [
        f"model={model}",
        "data=synthetic",
        "parallel=none",
        "cluster.nproc=1",
        "trainer.precision=bf16",
        f"trainer.micro_batch_size={micro_batch}",
        "trainer.max_steps=3",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.ckpt_every=0",
        "logger=jsonl",
    ]
    done = hpctrain(*overrides, f"hydra.run.dir={run_dir}", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = max(r["peak_mem_gib"] for r in metrics(run_dir) if "peak_mem_gib" in r) * 2**30
    planned = estimate(to_typed(compose(overrides))).largest.total
    ratio = measured / planned
    print(
        f"{model} micro-batch {micro_batch}: peak {measured / 2**30:.2f} GiB, plan {planned / 2**30:.2f} GiB"
    )
    assert abs(ratio - 1) <= PLAN_TOLERANCE, f"peak / plan = {ratio:.3f}"


def test_fp16_with_async_checkpoints_resumes_on_the_gpu(tmp_path: Path) -> None:
    """The trainer's whole GPU path: fp16 with its scaler, async checkpoints staged into pinned memory, a
    resume; the resumed run ends where the uninterrupted one does."""
    common = [
        *FAST,
        "parallel=none",
        "cluster.nproc=1",
        "trainer.precision=fp16",
        "trainer.log_every=1",
        "trainer.async_checkpoint=true",
        "trainer.ckpt_every=2",
        "trainer.eval_every=0",
    ]
    whole, part = tmp_path / "whole", tmp_path / "part"
    for args in (
        [*common, "trainer.max_steps=6", f"hydra.run.dir={whole}"],
        [*common, "trainer.max_steps=4", f"hydra.run.dir={part}"],
        [*common, "trainer.max_steps=6", f"hydra.run.dir={part}"],  # resumes from step 4
    ):
        done = hpctrain(*args)
        assert done.returncode == 0, done.stderr[-3000:]
    steps = [r["step"] for r in metrics(part) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # every step logged once
    end = {run: metrics(run)[-1]["loss"] for run in (whole, part)}
    assert end[part] == pytest.approx(end[whole], rel=1e-3)


def test_an_out_of_memory_names_what_filled_the_gpu(tmp_path: Path) -> None:
    """Issue 43, item 3: GPT-2 medium at a micro-batch that cannot fit, with the allocator's history armed:
    the rank writes its snapshot and the largest live allocations, the run fails (never exit 0), and the
    verdict in status names them beside the plan's figure. Also the cost of arming the history: the same
    fitting run's step time with and without it (printed, not asserted)."""
    run = tmp_path / "oom"
    overrides = [
        "model=gpt2_350m",
        "data=synthetic",
        "parallel=none",
        "cluster.nproc=1",
        "trainer.precision=bf16",
        "trainer.max_steps=3",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "logger=jsonl",
        "plan_check=false",  # the plan would refuse it, rightly: this run is meant to run out
        "trainer.memory_history=true",
    ]
    done = hpctrain(*overrides, "trainer.micro_batch_size=512", f"hydra.run.dir={run}", timeout=600)
    assert done.returncode != 0
    summary = json.loads((run / "memory" / "rank0.json").read_text())
    assert summary["allocated"] > 2**30 and summary["top"] and "in " in summary["top"][0]["where"], summary
    assert (run / "memory" / "rank0.pickle").stat().st_size > 0
    status = hpctrain("status", str(run)).stdout
    assert "GiB allocated; largest:" in status and "(plan: " in status, status
    timing = {}
    for history in ("true", "false"):
        fit = tmp_path / f"fit-{history}"
        args = [
            *overrides[:-1],
            f"trainer.memory_history={history}",
            "trainer.max_steps=20",
            "trainer.log_every=1",
        ]
        ok = hpctrain(*args, "trainer.micro_batch_size=4", f"hydra.run.dir={fit}", timeout=600)
        assert ok.returncode == 0, ok.stderr[-3000:]
        timing[history] = statistics.median(r["step_time_s"] for r in metrics(fit)[5:])
    print(f"memory history: step {timing['true']:.4f} s armed, {timing['false']:.4f} s not")


def test_the_nccl_flight_recorder_records_the_last_collectives(tmp_path: Path) -> None:
    """Issue 43, item 2: with hpctrain's settings the flight recorder holds a one-rank NCCL group's
    collectives, and the hang dump's writer puts them beside the stacks."""
    from hpctrain.resilience import stacks
    from hpctrain.rundir import RunDir

    env = DistEnv(0, 0, 1, 1, "127.0.0.1", _free_port(), socket.gethostname())
    device = init_distributed(env, 60, RunDir(tmp_path))
    try:
        t = torch.ones(4, device=device)
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        stacks.dump_flight_record(tmp_path, "hang-x", 0)
        record = RunDir(tmp_path).flight_dump("hang-x", 0)
        assert record.stat().st_size > 0
    finally:
        dist.destroy_process_group()
