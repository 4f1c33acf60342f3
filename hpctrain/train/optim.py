"""Optimizers and the learning-rate schedule (linear warmup, cosine decay; GPT-3 paper §2.3 / nanoGPT)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from hpctrain.config.schema import OptimConfig


def build_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    # Weight decay on matrices only: decaying biases, norms and embeddings' 1-D gains hurts (nanoGPT).
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # An empty group (LoRA's adapters are matrices only) would break torch's flattened optimizer state dict.
    groups = [g for g in groups if g["params"]]
    if optim.name == "adamw":
        # fused=None leaves torch its default (foreach on GPUs); True: one fused kernel for all updates.
        return torch.optim.AdamW(
            groups, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=optim.fused or None
        )
    if optim.name == "sgd":
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum, nesterov=optim.nesterov)
    raise ValueError(f"unknown optimizer {optim.name!r}")


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr before optimizer step ``step`` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Schedule:
    """The multiplier of the peak lr per step: :func:`lr_factor`, or, from ``anchor_step`` on, a cosine from
    ``anchor_factor`` down to ``min_ratio`` at ``total_steps``. The anchor is where a resumed run changed
    the schedule's length (or warmup, or floor) past its warmup: the lr goes on from where it was, never
    jumping (the checkpoint's manifest keeps the anchor for later resumes)."""

    warmup_steps: int
    total_steps: int
    min_ratio: float
    anchor_step: int | None = None
    anchor_factor: float = 1.0

    def __call__(self, step: int) -> float:
        if self.anchor_step is None or step < self.anchor_step:
            return lr_factor(step, self.warmup_steps, self.total_steps, self.min_ratio)
        span = max(1, self.total_steps - self.anchor_step)
        progress = min(1.0, (step - self.anchor_step) / span)
        return self.min_ratio + (self.anchor_factor - self.min_ratio) * 0.5 * (
            1.0 + math.cos(math.pi * progress)
        )


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int) -> LambdaLR:
    schedule = Schedule(optim.warmup_steps, total_steps, optim.min_lr_ratio)

    # A plain function (not the Schedule itself): LambdaLR saves a callable object's __dict__ in its state,
    # which would change what a checkpoint holds; the anchor travels in the manifest instead.
    def factor(step: int) -> float:
        return schedule(step)

    factor.schedule = schedule  # type: ignore[attr-defined]
    return LambdaLR(optimizer, factor)


def schedule_of(scheduler: LambdaLR) -> Schedule:
    """The Schedule behind a scheduler made by :func:`build_scheduler` (every parameter group shares it)."""
    return scheduler.lr_lambdas[0].schedule  # type: ignore[attr-defined,no-any-return]
