"""Throughput and MFU (hpctrain.train.metrics): samples or tokens per second, in all and per device, the
part of a step spent waiting for data, MFU against a stated peak (none without one), and what a model's
throughput is counted in."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.shape import run_shape
from hpctrain.models.builtin import GPTSpec
from hpctrain.models.flops import flops_per_token, param_count
from hpctrain.models.spec import ModelSpec
from hpctrain.train.metrics import RunFacts, Throughput, device_peak_flops, mfu, run_facts

CPU = torch.device("cpu")


def test_a_report_averages_the_steps_since_the_last() -> None:
    # An fp32 run: its MFU is against the fp32 peak (hpctrain.precision.matmul_peak).
    cfg = to_typed(
        compose(["cluster.nproc=2", "trainer.global_batch_size=32", "cluster.peak_fp32_flops=1e12"])
    )
    meter = Throughput(cfg, run_shape(cfg), CPU, RunFacts(1000, 64, True, 6000.0))
    meter.step_done(0.5, data_wait=0.1)
    meter.step_done(1.5, data_wait=0.3)
    report = meter.report()
    assert report["step_time_s"] == 1.0 and report["data_wait_s"] == pytest.approx(0.2)
    assert report["tokens_per_s"] == 32 * 64 and report["tokens_per_s_per_device"] == 32 * 64 / 2
    assert report["mfu"] == pytest.approx(6000.0 * 32 * 64 / (1e12 * 2))
    assert 0 < report["peak_mem_gib"] < 64  # this process's peak resident set
    assert "samples_per_s" not in report
    images = Throughput(cfg, run_shape(cfg), CPU, RunFacts(1000, 1, False, 6000.0))
    images.step_done(2.0)
    assert images.report()["samples_per_s"] == 16.0


def test_mfu_needs_a_peak() -> None:
    assert mfu(100.0, 10.0, None, 4) is None and mfu(100.0, 10.0, 1000.0, 2) == 0.5
    assert device_peak_flops(CPU, None) is None and device_peak_flops(CPU, 5e11) == 5e11


def test_a_declared_model_is_counted_by_its_spec_a_users_by_its_tensors() -> None:
    spec = GPTSpec(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
    assert run_facts(spec, nn.Identity(), None) == RunFacts(
        param_count(spec), 16, True, flops_per_token(spec)
    )
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # tied: counted once
    user = nn.Sequential(embed, head)
    facts = run_facts(ModelSpec(target="mine.Net"), user, torch.zeros(2, 7, dtype=torch.long))
    assert facts == RunFacts(40, 7, True, 6.0 * 40)  # 6·N per token (Kaplan et al.)
    assert run_facts(ModelSpec(target="mine.Net"), user, torch.zeros(2, 3, 8, 8)) == RunFacts(
        40, 1, False, 240.0
    )


def test_mfu_is_against_the_peak_of_the_runs_precision() -> None:
    """The peak the planner priced the step at (hpctrain.precision.matmul_peak): an fp32 run's fp32 peak, a
    bf16 run's peak_flops, never the bf16 peak for an fp32 run (which made its MFU 2-16× too low)."""
    peaks = ["cluster.peak_fp32_flops=1e12", "cluster.peak_flops=8e12"]
    for precision, peak in (("fp32", 1e12), ("bf16", 8e12), ("fp16", 8e12)):
        cfg = to_typed(compose(["cluster.nproc=1", *peaks, f"trainer.precision={precision}"]))
        meter = Throughput(cfg, run_shape(cfg), CPU, RunFacts(1000, 1, False, 6000.0))
        meter.step_done(1.0)
        assert meter.report()["mfu"] == pytest.approx(6000.0 * 16 / peak), precision
    fp32_only = to_typed(compose(["cluster.nproc=1", "cluster.peak_flops=8e12"]))
    assert "mfu" not in Throughput(fp32_only, run_shape(fp32_only), CPU, RunFacts(1, 1, False, 6.0)).report()
