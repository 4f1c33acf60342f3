"""What watches each step of the loop, grouped so that :func:`hpctrain.train.trainer.fit` reads as the loop:
the hang watchdog's phases, test-only fault points, the profiler window, the data-wait and straggler
measurements, throughput and MFU, and the cadence of logging and evaluation (that of checkpoints is the
checkpointer's: :mod:`hpctrain.checkpoint.cadence`).

Every collective here (the straggler report, the mean loss over ranks) runs on every rank at the same step,
in the same order, whatever the rank: the decisions depend only on the step and the config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.faults import FaultInjector
from hpctrain.observe.profile import profile_dir, start_profiler
from hpctrain.observe.stragglers import StragglerMonitor
from hpctrain.resilience.watchdog import Watchdog
from hpctrain.train.metrics import RunFacts, Throughput


class StepMonitors:
    """The per-step monitors of one rank's run."""

    def __init__(
        self,
        cfg: Config,
        shape: RunShape,
        device: torch.device,
        rank: int,
        hostname: str,
        run_dir: Path,
        facts: RunFacts,
        watchdog: Watchdog,
        faults: FaultInjector,
    ) -> None:
        t = cfg.trainer
        self.cfg, self.shape, self.device, self.rank, self.run_dir = cfg, shape, device, rank, run_dir
        self.watchdog, self.faults = watchdog, faults
        self.profile_first, self.profile_last = (
            (int(x) for x in t.profile.split(":")) if t.profile else (-1, -1)
        )
        self.profiler: torch.profiler.profile | None = None
        self.stragglers = StragglerMonitor(t.straggler_every, device, hostname)
        self.speed = Throughput(cfg, shape, device, facts)
        self.router: Any = None  # a mixture of experts' routing (hpctrain.parallel.moe.RouterMetrics)
        self.step_s = 0.0  # the last step's wall time
        self.data_s = 0.0  # the last step's wait for its batch

    def next_batch(self, step: int, next_step: Callable[[], Any]) -> Any:
        """Enter step ``step``: its fault points, the profiler window's start, then its batch (timed: the
        data wait); the watchdog times what follows as compute."""
        self.watchdog.enter(step, "data")
        self.faults.at("step", step)
        if step == self.profile_first:
            self.profiler = start_profiler(profile_dir(self.cfg, self.run_dir), self.rank, self.device)
        data_start = time.perf_counter()
        self.faults.at("data", step)
        passes = next_step()
        self.data_s = time.perf_counter() - data_start
        self.stragglers.data_done(self.data_s)
        self.watchdog.enter(step, "compute")
        return passes

    def step_done(self, step: int, step_s: float) -> None:
        """Step ``step`` took ``step_s``; what follows (evaluation, logging) is not timed as the step."""
        self.step_s = step_s
        self.speed.step_done(step_s, self.data_s)
        self.watchdog.step_done(step_s)
        self.watchdog.enter(step, "report")
        self.faults.at("report", step)
        if self.profiler is not None and step == self.profile_last:
            self.profiler.stop()  # writes the trace
            self.profiler = None

    def record(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, skipped: bool = False
    ) -> dict[str, Any] | None:
        """The metrics record of step ``step`` when one is due (logging cadence, an evaluation or a straggler
        report), else None. Its ``evaluate`` key says whether the caller adds the evaluation. A ``skipped``
        step (the non-finite guard applied no update; every rank agreed, so every rank comes here alike) has
        a record always, ``"nonfinite": true``: whoever reads metrics.jsonl sees every skipped step, not only
        those that fell on a logging step. Between logging steps it holds the step's own loss, gradient norm
        and learning rate only: the throughput window runs on to the next logging step, as it would have."""
        t = self.cfg.trainer
        evaluate_now = step == t.max_steps or (t.eval_every > 0 and step % t.eval_every == 0)
        straggler = self.stragglers.report() if self.stragglers.due(step) else None
        due = step % t.log_interval() == 0 or evaluate_now or straggler is not None
        if not (due or skipped):
            return None
        record: dict[str, Any] = {
            "step": step,
            "loss": _mean_over_ranks(loss, self.shape.loss_holders),
            "lr": lr,
        }
        record["grad_norm"] = float(grad_norm)
        if skipped:
            record["nonfinite"] = True
        if not due:
            record["evaluate"] = False
            return record
        record.update(self.speed.report())
        if self.router is not None:  # a collective: every rank reports at the same steps
            record.update(self.router.report(self.device))
        record.update(straggler or {})
        record["evaluate"] = evaluate_now
        return record


def _mean_over_ranks(value: torch.Tensor, holders: int) -> float:
    """Mean of ``value`` over the ``holders`` ranks that have it (the others contribute 0)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= holders
    return float(value)
