"""Throughput and model FLOPs utilisation.

MFU = achieved model FLOP/s ÷ peak FLOP/s, with model FLOPs per token = 6N + 12·L·H·Q·T (PaLM, Chowdhery et
al. 2022, appendix B: N non-embedding parameters, L layers, H heads, Q head dim, T tokens per sample). The
peak is the dense bf16 tensor-core figure of the device (vendor data sheets), or ``cluster.peak_flops``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.models.spec import ModelSpec

# Dense bf16 peak FLOP/s per device, from the vendors' data sheets (no sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is 756e12, matched first below
    "H100 PCIe": 756e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "V100": 125e12,  # fp16 tensor cores: V100 has no bf16
}


def device_peak_flops(device: torch.device, configured: float | None) -> float | None:
    """The peak used for MFU: the configured one, else the GPU's data-sheet figure, else None (no MFU)."""
    if configured:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
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
        self.peak = device_peak_flops(device, cfg.cluster.peak_flops)
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
