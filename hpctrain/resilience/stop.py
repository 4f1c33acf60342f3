"""The per-step question "do we stop now?", answered the same on every rank.

One all-reduce (MAX) of a stop code per step: a signal that reached any rank, or rank 0's walltime guard,
stops every rank at the same step boundary, so they all save the same step and exit together.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hpctrain.resilience import walltime
from hpctrain.resilience.signals import WALLTIME, StopSignals, describe


class StopCheck:
    def __init__(
        self, signals: StopSignals, end_time: float | None, is_main: bool, device: torch.device
    ) -> None:
        self.signals = signals
        self.end_time = end_time  # only rank 0's guard decides: nodes' clocks may disagree by seconds
        self.is_main = is_main
        self.device = device

    def __call__(self, step_s: float, save_s: float | None) -> str | None:
        """Why to stop after this step (a collective: every rank calls it at every step), or None."""
        code = self.signals.received
        if not code and self.is_main and walltime.should_stop(time.time(), self.end_time, step_s, save_s):
            code = WALLTIME
        flag = torch.tensor([code], dtype=torch.int64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        return describe(agreed) if agreed else None
