"""``trainer.ckpt_every=auto``: the checkpoint interval from the measured cost of a save and the run's
observed interruption rate.

Young's first-order optimum (J. W. Young, "A first order approximation to the optimum checkpoint interval",
Commun. ACM 17(9), 1974) is τ = √(2·δ·M) for a save of δ seconds and a mean time between interruptions M;
Daly's refinement (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22(3), 2006, eq. 37 to first order) subtracts the save itself:
τ = √(2·δ·M) − δ for δ < 2M, else τ = M. The interval in steps is τ over the step time, at least 1.

δ is measured: each start of the workers (a fresh run, a restart, a requeue) saves its first step, and every
rank takes the largest δ and step time of all ranks (one all-reduce, once per start), so all ranks agree on
the interval. M is observed: the run's time since its first logged step over its interruptions (restarts
inside the allocation in restarts.jsonl, and Slurm's requeues of this job); before any interruption,
``cluster.mtbf_h``. Re-evaluated at every start, i.e. after each interruption; the choice is logged.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.rundir import RunDir

log = logging.getLogger(__name__)


def young_daly_s(save_s: float, mtbf_s: float) -> float:
    """The optimum time between checkpoints (Daly 2006, first order): √(2δM) − δ for δ < 2M, else M."""
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    return math.sqrt(2 * save_s * mtbf_s) - save_s


def observed_mtbf_s(run_dir: Path, default_s: float, now: float) -> tuple[float, str]:
    """The run's mean time between interruptions so far, and where it came from."""
    rd = RunDir(run_dir)
    restarts = sum(1 for r in rd.read_restarts() if r.get("action") == "restart")
    interruptions = restarts + int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    records = rd.read_metrics()
    if interruptions == 0 or not records or "time" not in records[0]:
        return default_s, "cluster.mtbf_h (no interruption yet)"
    span = max(now - float(records[0]["time"]), 1.0)
    return span / interruptions, f"observed: {interruptions} interruption(s) in {span:.0f} s"


class AutoInterval:
    """The save schedule of ``ckpt_every=auto`` for one start of the workers."""

    def __init__(self, run_dir: Path, mtbf_default_s: float, device: torch.device) -> None:
        self.run_dir = run_dir
        self.mtbf_default_s = mtbf_default_s
        self.device = device
        self.every: int | None = None  # steps between saves; None until this start's first save is timed
        self.last_saved: int | None = None

    def due(self, step: int) -> bool:
        if self.every is None or self.last_saved is None:
            return self.last_saved is None  # this start's first step: its save measures δ
        return step - self.last_saved >= self.every

    def saved(self, step: int, step_s: float, save_s: float) -> None:
        """A shared save of ``step`` took ``save_s``: after this start's first, choose the interval."""
        first = self.last_saved is None
        self.last_saved = step
        if not first:
            return
        both = torch.tensor([step_s, save_s], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
        step_s, save_s = (float(v) for v in both.tolist())
        mtbf_s, source = observed_mtbf_s(self.run_dir, self.mtbf_default_s, time.time())
        tau = young_daly_s(save_s, mtbf_s)
        self.every = max(1, round(tau / max(step_s, 1e-6)))
        log.info(
            "trainer.ckpt_every=auto: a save every %d steps (save %.3f s, MTBF %.0f s from %s, step %.3f s: "
            "Young/Daly sqrt(2*save*MTBF) - save = %.1f s)",
            self.every, save_s, mtbf_s, source, step_s, tau,
        )  # fmt: skip
