"""Checkpoint-interval rules and the ETTR each gives, for exponential failures. Pure and torch-free: the
trainer's ``trainer.ckpt_every=auto`` (:mod:`hpctrain.checkpoint.cadence`) and the planner's projection
(:mod:`hpctrain.plan.ettr`) share them.

τ: the work between two saves; δ: a save's cost; M: the mean time to failure; R: a recovery's cost.

- Young (J. W. Young, "A first order approximation to the optimum checkpoint interval", Commun. ACM 17(9),
  1974): τ = √(2δM);
- Daly, first order (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), 2006, eq. 37 to first order): τ = √(2δM) − δ for δ < 2M, else M;
- availability-optimal (Saxena et al., "Optimal Checkpoint Interval with Availability as an Objective
  Function", arXiv 2410.18124): Tc = δ + √(2(M + R)δ + δ²), which counts the recovery time Young and Daly
  leave out.

The ETTR of an interval is Daly's expected wall time for failures that may strike during work, saves and
recoveries (FGCS 2006, eq. 20: T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ):
ETTR = τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1)).
:func:`best_rule` scores the three rules by it.
"""

from __future__ import annotations

import math


def young_s(save_s: float, mttf_s: float) -> float:
    return math.sqrt(2 * save_s * mttf_s)


def daly_s(save_s: float, mttf_s: float) -> float:
    return mttf_s if save_s >= 2 * mttf_s else math.sqrt(2 * save_s * mttf_s) - save_s


def availability_s(save_s: float, mttf_s: float, recovery_s: float) -> float:
    return save_s + math.sqrt(2 * (mttf_s + recovery_s) * save_s + save_s**2)


RULES = ("young", "daly", "availability")


def interval_s(rule: str, save_s: float, mttf_s: float, recovery_s: float) -> float:
    if rule == "young":
        return young_s(save_s, mttf_s)
    if rule == "daly":
        return daly_s(save_s, mttf_s)
    if rule == "availability":
        return availability_s(save_s, mttf_s, recovery_s)
    raise ValueError(f"unknown interval rule {rule!r} (known: {', '.join(RULES)})")


def daly_ettr(tau_s: float, save_s: float, mttf_s: float, recovery_s: float) -> float:
    """Expected ETTR of saving every ``tau_s`` of work (Daly 2006, eq. 20; module docstring)."""
    if tau_s <= 0:
        return 0.0
    # expm1 keeps the small exponent's precision (an MTTF of weeks against a step of seconds).
    wall = mttf_s * math.exp(recovery_s / mttf_s) * math.expm1((tau_s + save_s) / mttf_s)
    return tau_s / wall


def best_rule(save_s: float, mttf_s: float, recovery_s: float) -> tuple[str, float, float]:
    """The interval rule with the higher expected ETTR here: (rule, its interval, its ETTR)."""
    scored = []
    for rule in RULES:
        tau = max(interval_s(rule, save_s, mttf_s, recovery_s), 1e-9)
        scored.append((daly_ettr(tau, save_s, mttf_s, recovery_s), rule, tau))
    ettr, rule, tau = max(scored)
    return rule, tau, ettr
