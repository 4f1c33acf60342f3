"""Throughput and model FLOPs utilisation.

MFU = achieved model FLOP/s ÷ peak FLOP/s, with model FLOPs per token = 6N + 12·L·H·Q·T (PaLM, Chowdhery et
al. 2022, appendix B: N non-embedding parameters, L layers, H heads, Q head dim, T tokens per sample). The
peak is the one the run's precision computes at (:func:`hpctrain.precision.matmul_peak`: an fp32 run's IEEE
float32 peak, a bf16/fp16/fp8 run's dense 16-bit tensor-core peak), the same the planner prices the step at:
the cluster profile's key for it (``cluster.peak_fp32_flops``, ``cluster.peak_flops``, ...), else the
device's data-sheet figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.models.spec import ModelSpec
from hpctrain.precision import matmul_peak

# Dense peak FLOP/s per device and kind of matmul (hpctrain.precision.PEAKS), from the vendors' data sheets
# (no sparsity: the tensor-core figures NVIDIA gives with sparsity, halved): fp32 on CUDA cores, TF32, bf16
# (= fp16) and float8 on tensor cores. The H100 SXM's TF32 from the Hopper whitepaper's clocks.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989e12, "fp8": 1979e12},  # the H100 SXM's cores
    "H100": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989e12, "fp8": 1979e12},  # SXM
    "H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp8": 1513e12},  # matched before H100
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},  # no float8
    "L40S": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp8": 733e12},
    "A10G": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12},
    "V100": {"fp32": 15.7e12, "bf16": 125e12},  # fp16 tensor cores (V100 has no bf16 nor TF32)
}


def device_peak_flops(device: torch.device, configured: float | None, kind: str = "bf16") -> float | None:
    """The peak used for MFU, of the ``kind`` of matmul the run computes (hpctrain.precision.matmul_peak):
    the configured one, else the GPU's data-sheet figure of that kind, else None (no MFU)."""
    if configured:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_FLOPS[key].get(kind)
    return None


def mfu(
    flops_per_token: float, tokens_per_s: float, peak_flops: float | None, world_size: int
) -> float | None:
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_s / (peak_flops * world_size)


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far: the CUDA caching allocator's peak on a GPU, else the peak resident
    set (VmHWM: parameters, activations, and the interpreter and libraries too)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    return 0.0


@dataclass(frozen=True)
class RunFacts:
    """What throughput and MFU are measured in, for this run's model."""

    n_params: int
    tokens_per_sample: int  # 1: throughput in samples
    per_token: bool  # report tokens/s (the input is a sequence of token ids)
    flops_per_token: float


def run_facts(spec: ModelSpec, model: nn.Module, sample_input: Any) -> RunFacts:
    """The spec's declared facts, else facts derived from the built model and one input: the parameters
    counted (each shared tensor once; a sharded DTensor counts its global size, so the count is the whole
    model's under FSDP and TP too), token ids ``[B, T]`` make ``T`` tokens per sample, and
    the FLOPs are 6·N per token (Kaplan et al. 2020, eq. 2.2: the attention term left out, so MFU is a lower
    bound)."""
    declared = spec.param_count()
    if declared is not None:
        flops = spec.flops_per_token()
        assert flops is not None
        return RunFacts(declared, spec.tokens_per_sample, spec.per_token, flops)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    ids = (
        isinstance(sample_input, torch.Tensor)
        and sample_input.dim() == 2
        and not sample_input.is_floating_point()
    )
    tokens = int(sample_input.shape[1]) if ids else 1
    return RunFacts(n, tokens, ids, 6.0 * n)


class Throughput:
    """Step times since the last report → step time, the part of it spent waiting for the batch (on this
    rank), samples/s or tokens/s (in all and per device), MFU (hpctrain.train.metrics: 6N + 12·L·H·Q·T
    FLOPs per token against the device's peak), and this rank's peak memory."""

    def __init__(self, cfg: Config, shape: RunShape, device: torch.device, facts: RunFacts) -> None:
        self.samples_per_step = shape.global_batch_size
        self.tokens_per_sample = facts.tokens_per_sample
        self.is_tokens = facts.per_token
        self.flops_per_token = facts.flops_per_token
        # The peak of the run's precision, the one the planner priced its step at.
        kind = matmul_peak(cfg.trainer.precision)
        self.peak = device_peak_flops(device, cfg.cluster.peak(kind), kind)
        self.world_size = shape.world_size
        self.device = device
        self._times: list[float] = []
        self._waits: list[float] = []

    def step_done(self, seconds: float, data_wait: float = 0.0) -> None:
        self._times.append(seconds)
        self._waits.append(data_wait)

    def report(self) -> dict[str, float | None]:
        step_time = sum(self._times) / max(1, len(self._times))
        data_wait = sum(self._waits) / max(1, len(self._waits))
        self._times.clear()
        self._waits.clear()
        samples_per_s = self.samples_per_step / step_time if step_time > 0 else 0.0
        tokens_per_s = samples_per_s * self.tokens_per_sample
        # data_wait_s: the mean time a step spent getting its batch (from the DataLoader workers' queue, or
        # built on the training thread without workers); a share near 0 means the input pipeline keeps up.
        out: dict[str, float | None] = {"step_time_s": step_time, "data_wait_s": data_wait}
        out["tokens_per_s" if self.is_tokens else "samples_per_s"] = (
            tokens_per_s if self.is_tokens else samples_per_s
        )
        out["tokens_per_s_per_device" if self.is_tokens else "samples_per_s_per_device"] = (
            tokens_per_s if self.is_tokens else samples_per_s
        ) / self.world_size
        out["mfu"] = mfu(self.flops_per_token, tokens_per_s, self.peak, self.world_size)
        out["peak_mem_gib"] = peak_memory_gib(self.device)
        return {k: v for k, v in out.items() if v is not None}
