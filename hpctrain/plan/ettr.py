"""The effective training time ratio (ETTR: productive time ÷ wall time) projected at a scale this machine
cannot reach: from failure rates by cluster size, the recovery each fault class costs, and the checkpoint
interval. Pure and torch-free (``hpctrain plan`` prints a line of it; ``bench/ettr_sim.py`` the whole table).

Failure rates: a job's mean time to failure (MTTF) by its GPUs, from Kokolis et al., "Revisiting Reliability
in Large-Scale Machine Learning Research Clusters" (HPCA 2025, arXiv 2410.21680): ~47 days at 8 GPUs, ~8 h at
1,024, ~1.8 h at 16,384; between and beyond those points, a power law through the two nearest
(:func:`mttf_h`); ``bench/ettr_sim.py --mttf`` takes a site's own.

Checkpoint intervals and the ETTR of one (Young, Daly, the availability optimum of arXiv 2410.18124; Daly's
closed form for exponential failures) are :mod:`hpctrain.checkpoint.intervals`'s, which the trainer's
``trainer.ckpt_every=auto`` shares. With fault classes of different costs (some of which roll nothing back),
:func:`simulate` draws the faults instead (Monte Carlo, seeded).

Recovery costs by class are hpctrain's own, measured by ``bench/chaos.py`` on the test cluster
(:data:`MEASURED`): a killed rank is training again in 2.0-2.4 s inside the allocation, a hung one in
6.3-7.2 s, a lost node on a spare in 6.7 s, a pre-emption through a requeue in 13.7-21.6 s (plus the
queue's wait). What a class rolls back is the work since the last committed checkpoint.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpctrain.checkpoint.intervals import best_rule, daly_ettr, interval_s

HOUR = 3600.0
# (GPUs, MTTF in hours) of a job of that size: Kokolis et al., HPCA 2025 (47 days, 8 h, 1.8 h).
KOKOLIS_MTTF_H: tuple[tuple[int, float], ...] = ((8, 47 * 24.0), (1024, 8.0), (16384, 1.8))
SIZES = (8, 64, 512, 1024, 4096, 16384)


def mttf_h(gpus: int, points: Sequence[tuple[int, float]] = KOKOLIS_MTTF_H) -> float:
    """A job's MTTF at ``gpus`` GPUs: log-log interpolation between the nearest two points."""
    pts = sorted(points)
    if gpus <= 0:
        raise ValueError("gpus must be ≥ 1")
    if len(pts) == 1:
        return pts[0][1] * pts[0][0] / gpus  # one point: failures scale with the GPUs
    lower = max((p for p in pts if p[0] <= gpus), default=pts[0], key=lambda p: p[0])
    upper = min((p for p in pts if p[0] > gpus), default=pts[-1], key=lambda p: p[0])
    if lower == upper:  # beyond the last point (or before the first): the nearest segment's slope
        i = pts.index(lower)
        lower, upper = (pts[-2], pts[-1]) if i == len(pts) - 1 else (pts[0], pts[1])
    slope = math.log(upper[1] / lower[1]) / math.log(upper[0] / lower[0])
    return lower[1] * (gpus / lower[0]) ** slope


# ------------------------------------------------------------------------------------ classes, recovery


@dataclass(frozen=True)
class FaultClass:
    """One kind of fault: its share of all faults, the seconds from the fault to training again (detection,
    restart or requeue, load, first step), and whether it rolls the run back to its last checkpoint (a NaN
    step is skipped in place; a pre-emption saves before it goes)."""

    name: str
    share: float
    recovery_s: float
    rolls_back: bool = True
    requeue: bool = False  # the allocation is gone: the job waits in the queue again


# bench/chaos.py, 2026-11-27 (docs/performance-history.md): fault -> next step, inside the allocation.
MEASURED = {
    "rank killed": 2.04,
    "rank hung": 6.33,
    "node lost (spare)": 6.74,
    "pre-emption (requeue)": 13.7,
    "NaN step": 0.16,
}
REQUEUE_S = 20.7  # bench/preemption.py: a requeued job's signal -> first step (without the queue's wait)
# The mix of faults of a large job (an assumption, named so, overridable): Kokolis et al. attribute most
# job failures at scale to the hardware (GPUs, their links, the network, the hosts); the rest are software
# faults a restart clears, and hangs.
DEFAULT_SHARES = {"node": 0.6, "crash": 0.3, "hang": 0.1}


def hpctrain_classes(
    load_s: float, spares: bool = True, shares: dict[str, float] | None = None
) -> tuple[FaultClass, ...]:
    """Recovery as hpctrain does it: restarts inside the allocation, a spare node for a lost one
    (``spares=False``: a lost node requeues the job), ``load_s`` the checkpoint's load beyond what the
    measured restarts already include (their checkpoints were tiny)."""
    s = shares or DEFAULT_SHARES
    node = (
        FaultClass("node lost", s["node"], MEASURED["node lost (spare)"] + load_s)
        if spares
        else FaultClass("node lost", s["node"], REQUEUE_S + load_s, requeue=True)
    )
    return (
        node,
        FaultClass("rank crashed", s["crash"], MEASURED["rank killed"] + load_s),
        FaultClass("rank hung", s["hang"], MEASURED["rank hung"] + load_s),
    )


def requeue_only_classes(load_s: float, shares: dict[str, float] | None = None) -> tuple[FaultClass, ...]:
    """Every fault ends the job, which waits in the queue again (what a job without in-allocation restarts
    gets)."""
    s = shares or DEFAULT_SHARES
    cost = REQUEUE_S + load_s
    return tuple(FaultClass(name, s[name], cost, requeue=True) for name in ("node", "crash", "hang"))


def mean_recovery_s(classes: Sequence[FaultClass], queue_wait_s: float = 0.0) -> float:
    """A fault's mean cost, a requeue's mean wait in the queue (``queue_wait_s``) included."""
    total = sum(c.share for c in classes)
    return sum(c.share * (c.recovery_s + (queue_wait_s if c.requeue else 0.0)) for c in classes) / total


# ----------------------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class Scenario:
    tau_s: float  # work between two saves
    save_s: float  # a save's cost to training (its stall, or what a background write slows)
    mttf_s: float
    classes: tuple[FaultClass, ...]
    queue_wait_mean_s: float = 0.0  # a requeue's wait in the queue: exponential with this mean


def simulate(scenario: Scenario, work_s: float, seed: int = 0) -> float:
    """The ETTR of ``work_s`` seconds of training under ``scenario``, faults drawn as a Poisson process (one
    run of the Monte Carlo; :func:`expected_ettr` averages runs)."""
    rng = random.Random(seed)
    weights = [c.share for c in scenario.classes]
    wall = done = since = 0.0
    next_fault = rng.expovariate(1 / scenario.mttf_s)
    while done < work_s:
        todo = min(scenario.tau_s - since, work_s - done - since)  # the work left before the next save
        segment = todo + scenario.save_s
        if wall + segment <= next_fault:
            wall += segment
            done += since + todo  # committed
            since = 0.0
            continue
        worked = min(next_fault - wall, todo)  # a fault during the save: all worked, nothing saved
        fault = rng.choices(scenario.classes, weights)[0]
        since = 0.0 if fault.rolls_back else since + worked  # rolled back: trained again from the save
        mean_wait = scenario.queue_wait_mean_s if fault.requeue else 0.0
        wait = rng.expovariate(1 / mean_wait) if mean_wait else 0.0
        wall = next_fault + fault.recovery_s + wait
        next_fault = wall + rng.expovariate(1 / scenario.mttf_s)
    return work_s / wall


def expected_ettr(scenario: Scenario, work_s: float, runs: int = 20, seed: int = 0) -> float:
    return sum(simulate(scenario, work_s, seed + i) for i in range(runs)) / runs


def with_interval(scenario: Scenario, rule: str) -> Scenario:
    """``scenario`` saving every interval ``rule`` gives for its costs."""
    recovery = mean_recovery_s(scenario.classes, scenario.queue_wait_mean_s)
    return replace(scenario, tau_s=max(interval_s(rule, scenario.save_s, scenario.mttf_s, recovery), 1e-3))


# ----------------------------------------------------------------------------------------- the plan's line

# Training's wait for a save written beside it, as a share of the write (bench/checkpoint_stall.py:
# 0.150-0.185 of a synchronous save; the larger taken).
ASYNC_STALL = 0.185
QUEUE_WAIT_H = 1.0  # a requeued job's wait in the queue, assumed where a lost node requeues (no spare)
BYTES_PER_PARAM = 12  # a checkpoint's fp32 weights and AdamW's two fp32 moments


def plan_line(
    gpus: int, n_params: int, storage_gbps: float | None, spares: bool, background: bool, step_s: float | None
) -> str:
    """``hpctrain plan``'s ETTR line: the analytic ETTR (Daly 2006) at the plan's size, with the interval
    rule that scores best there (at least a step: ``step_s``, when the plan has a step time)."""
    if storage_gbps is None:
        return "ettr      not projected: cluster.storage_gbps (the file system's GB/s for the job) is unknown"
    from hpctrain.plan.units import duration, size

    ckpt = BYTES_PER_PARAM * n_params
    write_s = ckpt / (storage_gbps * 1e9)
    save_s = write_s * ASYNC_STALL if background else write_s
    mttf_s = mttf_h(gpus) * HOUR
    classes = hpctrain_classes(write_s, spares=spares)
    recovery = mean_recovery_s(classes, QUEUE_WAIT_H * HOUR)
    rule, tau, value = best_rule(save_s, mttf_s, recovery)
    if step_s is not None and tau < step_s:  # no save more often than every step
        tau, value = step_s, daly_ettr(step_s, save_s, mttf_s, recovery)
    lost = (
        "a lost node on a spare" if spares else f"a lost node requeues ({QUEUE_WAIT_H:g} h queued, assumed)"
    )
    save = (
        f"{duration(save_s)} ({ASYNC_STALL:g} of the write, beside training)"
        if background
        else duration(save_s)
    )
    return (
        f"ettr      {value:.3f} projected at {gpus:,} GPUs: MTTF {mttf_s / HOUR:.1f} h (Kokolis et al.), a "
        f"{size(ckpt)} checkpoint saved in {save} at cluster.storage_gbps={storage_gbps:g}, a save every "
        f"{duration(tau)} of work ({rule} rule), restarts inside the allocation, {lost} "
        "(bench/ettr_sim.py: the table)"
    )
