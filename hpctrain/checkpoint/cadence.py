"""When a step saves: :class:`Cadence` (the shared tier every ``trainer.ckpt_every`` steps, on the last step
and on a stop; the node-local fast tier every ``checkpoint.local_every`` steps), and
``trainer.ckpt_every=auto`` (:class:`AutoInterval`): the checkpoint interval from the measured cost of a save
and the run's observed interruption rate.

The interval is the best for the expected ETTR of three rules (:mod:`hpctrain.checkpoint.intervals`, each
cited there): Young's first-order optimum τ = √(2·δ·M) for a save of δ seconds and a mean time between
interruptions M; Daly's refinement τ = √(2·δ·M) − δ for δ < 2M, else M (what this used alone until
2026-12-07); and the availability optimum of arXiv 2410.18124, δ + √(2(M + R)δ + δ²), which counts the
recovery R (a restart as bench/chaos.py measured it, plus a load as long as the save). Each is scored by
Daly's closed form for exponential failures (FGCS 2006, eq. 20); the log names the rule chosen and what
Young/Daly would have given. The interval in steps is τ over the step time, at least 1.

δ is measured: each start of the workers (a fresh run, a restart, a requeue) saves its first step, and every
rank takes the largest δ, step time and observed M of all ranks (one all-reduce), so all ranks agree on the
interval. A save written beside training (``trainer.async_checkpoint``) returns after its stall, but its
write slows the steps it runs beside (the copy's and the write's memory traffic, the writer's CPU): its δ is
the stall + the excess of those steps over the steps after the write finished (the time it cost, measured
like ``bench/checkpoint_stall.py --saves``). That is known only once the write has ended, so the first
save's stall sets the interval and every save from the third on refines it with the cost of the write
before it (one more all-reduce a save: every rank reaches it at the same step). Without it the interval came
out too short: a stall of 0.08-0.19 s for a 124M GPT whose write cost the steps beside it several times that
(``bench/chaos.py --async-save``, 2026-11-27). The first save's write is not measured: it runs beside a
start's warm-up steps, whose excess it was charged (2.6-2.7 s against the 0.06-0.16 s a later write cost, an
interval of 435 steps where later ones were 43-102: ``bench/chaos.py``, 2026-12-07).

M is observed: the run's time since its first logged step over its interruptions (restarts inside the
allocation in the fault log, and Slurm's requeues of this job); before any interruption, ``cluster.mtbf_h``.
Re-evaluated at every start, i.e. after each interruption, and at each save as above; a change is logged.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.checkpoint import intervals
from hpctrain.config.schema import Config
from hpctrain.rundir import RunDir

log = logging.getLogger(__name__)

RULE_NAMES = {
    "young": "Young sqrt(2*save*MTBF)",
    "daly": "Young/Daly sqrt(2*save*MTBF) - save",
    "availability": "availability (arXiv 2410.18124) save + sqrt(2*(MTBF+recovery)*save + save^2)",
}


def young_daly_s(save_s: float, mtbf_s: float) -> float:
    """The optimum time between checkpoints (Daly 2006, first order): √(2δM) − δ for δ < 2M, else M."""
    return intervals.daly_s(save_s, mtbf_s)


# What a recovery costs, for the availability rule: a restart inside the allocation as bench/chaos.py
# measured it (a killed rank training again 2.04 s after), plus the checkpoint's load, taken as long as its
# save (the same bytes at the storage's speed).
RESTART_S = 2.04


def observed_mtbf_s(run_dir: Path, default_s: float, now: float) -> tuple[float, str]:
    """The run's mean time between interruptions so far, and where it came from."""
    rd = RunDir(run_dir)
    restarts = sum(1 for r in rd.read_answers() if r.get("action") == "restart")
    interruptions = restarts + int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    # Read at every save: only the first record's time, not the whole (growing) metrics file.
    first = rd.first_metric() if interruptions else None
    if first is None or "time" not in first:
        return default_s, "cluster.mtbf_h (no interruption yet)"
    span = max(now - float(first["time"]), 1.0)
    return span / interruptions, f"observed: {interruptions} interruption(s) in {span:.0f} s"


class AutoInterval:
    """The save schedule of ``ckpt_every=auto`` for one start of the workers. ``background``: saves are
    written beside training (their δ is refined at the second save, module docstring)."""

    def __init__(
        self, run_dir: Path, mtbf_default_s: float, device: torch.device, background: bool = False
    ) -> None:
        self.run_dir = run_dir
        self.mtbf_default_s = mtbf_default_s
        self.device = device
        self.background = background
        self.every: int | None = None  # steps between saves; None until this start's first save is timed
        self.last_saved: int | None = None
        self._beside: list[float] | None = None  # step times while the last save was written (None: not)
        self._after: list[float] = []  # step times after it was written, until the next save

    def due(self, step: int) -> bool:
        if self.every is None or self.last_saved is None:
            return self.last_saved is None  # this start's first step: its save measures δ
        return step - self.last_saved >= self.every

    def step_done(self, step_s: float, writing: bool) -> None:
        """A step took ``step_s``, a save being written beside it (``writing``) or not."""
        if self._beside is not None:
            (self._beside if writing else self._after).append(step_s)

    def saved(self, step: int, step_s: float, save_s: float) -> None:
        """A shared save of ``step`` took ``save_s``: after this start's first, choose the interval; after
        each later one, when saves are written beside training, choose it again with what the write before
        it cost. The first write is not measured: it runs beside a start's warm-up steps (kernels, caches,
        the writer's own start), whose excess it would be charged (module docstring)."""
        first = self.last_saved is None
        self.last_saved = step
        if first:
            self._choose(step_s, save_s, "save")
        elif self._beside is not None:
            beside, after = self._beside, self._after
            # The steps after the write are steps without one; none when the write outlasted the interval:
            # then every step between the two saves ran beside it and this save waited for it (in save_s).
            base = statistics.median(after) if after else min(beside, default=step_s)
            slowdown = sum(t - base for t in beside)
            self._choose(
                base,
                save_s + max(slowdown, 0.0),
                f"asynchronous save: stall and wait {save_s:.3f} s + {slowdown:.3f} s lost over the "
                f"{len(beside)} step(s) its write ran beside",
            )
        if self.background and not first:  # this save's write is measured until the next save
            self._beside, self._after = [], []

    def _choose(self, step_s: float, save_s: float, what: str) -> None:
        # Every input of the interval is agreed in one all-reduce, the observed MTBF too: each rank reads it
        # at its own time.time() and view of the run's files, and an interval one step apart on two ranks
        # sends one into a save's collectives while the other trains (a hang, bench/chaos.py 2026-12-07).
        mtbf_s, source = observed_mtbf_s(self.run_dir, self.mtbf_default_s, time.time())
        agreed = torch.tensor([step_s, save_s, mtbf_s], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        step_s, save_s, mtbf_s = (float(v) for v in agreed.tolist())
        recovery_s = RESTART_S + save_s
        rule, tau, ettr = intervals.best_rule(save_s, mtbf_s, recovery_s)
        daly = intervals.daly_s(save_s, mtbf_s)
        every, self.every = self.every, max(1, round(tau / max(step_s, 1e-6)))
        if every == self.every:  # each save refines it: said when it changes
            return
        log.info(
            "trainer.ckpt_every=auto: a save every %d steps (%s %.3f s, MTBF %.0f s from %s, step %.3f s, "
            "recovery %.1f s: the %s rule's %.1f s, expected ETTR %.5f; Young/Daly's "
            "sqrt(2*save*MTBF) - save = %.1f s, %.5f)",
            self.every,
            what,
            save_s,
            mtbf_s,
            source,
            step_s,
            recovery_s,
            RULE_NAMES[rule],
            tau,
            ettr,
            daly,
            intervals.daly_ettr(max(daly, 1e-9), save_s, mtbf_s, recovery_s),
        )


class Cadence:
    """The save schedule of one start of the workers: which tiers a step saves to (:meth:`due`), fed with
    each step's time and each save's cost for ``ckpt_every=auto``. ``local``: this rank has a fast tier."""

    def __init__(self, cfg: Config, run_dir: Path, device: torch.device, local: bool) -> None:
        t = cfg.trainer
        self.max_steps = t.max_steps
        self.every = t.ckpt_every  # an int, or "auto"
        self.local_every = cfg.checkpoint.local_every if local else None
        self.auto = (
            AutoInterval(run_dir, cfg.cluster.mtbf_h * 3600, device, background=t.async_checkpoint)
            if t.ckpt_every == "auto"
            else None
        )

    def due(self, step: int, stopping: bool) -> tuple[bool, bool]:
        """(a save to the shared tier, a copy to the node-local fast tier) due after step ``step``: the last
        step, a stop and every ``trainer.ckpt_every`` steps save to the shared tier; every
        ``checkpoint.local_every`` steps (not after the last: the fast tier serves restarts inside this job)
        copy to the fast tier."""
        final = step == self.max_steps or stopping
        if self.auto is not None:
            shared = final or self.auto.due(step)
        else:
            shared = final or (int(self.every) > 0 and step % int(self.every) == 0)
        local = self.local_every is not None and step % self.local_every == 0 and not final
        return shared, local

    def step_done(self, step_s: float, writing: bool) -> None:
        """A step took ``step_s``, a save being written beside it (``writing``) or not."""
        if self.auto is not None:
            self.auto.step_done(step_s, writing)

    def saved(self, step: int, shared: bool, step_s: float, save_s: float) -> None:
        """A save of ``step`` took ``save_s`` after a step of ``step_s`` (``auto`` times the shared ones)."""
        if self.auto is not None and shared:
            self.auto.saved(step, step_s, save_s)
