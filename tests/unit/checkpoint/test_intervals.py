"""The checkpoint-interval rules as their papers write them, and the ETTR that scores them
(hpctrain.checkpoint.intervals)."""

from __future__ import annotations

import math

import pytest

from hpctrain.checkpoint import intervals


def test_the_interval_rules_as_published() -> None:
    save, mttf, recovery = 30.0, 8 * 3600.0, 120.0
    assert intervals.young_s(save, mttf) == pytest.approx(math.sqrt(2 * save * mttf))
    assert intervals.daly_s(save, mttf) == pytest.approx(math.sqrt(2 * save * mttf) - save)
    assert intervals.daly_s(10.0, 4.0) == 4.0  # a save longer than 2M: every M
    # arXiv 2410.18124: Tc = Ts + sqrt(2 (Tf + Tr) Ts + Ts^2)
    assert intervals.availability_s(save, mttf, recovery) == pytest.approx(
        save + math.sqrt(2 * (mttf + recovery) * save + save**2)
    )
    with pytest.raises(ValueError, match="unknown interval rule 'weekly'"):
        intervals.interval_s("weekly", save, mttf, recovery)
    rule, tau, value = intervals.best_rule(save, mttf, recovery)
    assert tau == pytest.approx(intervals.interval_s(rule, save, mttf, recovery))
    assert rule in intervals.RULES and value == max(
        intervals.daly_ettr(intervals.interval_s(r, save, mttf, recovery), save, mttf, recovery)
        for r in intervals.RULES
    )
