"""Alternatives (hpctrain.plan.search): layouts that fit, ranked by step time, printed as overrides that
validate."""

from __future__ import annotations

from hpctrain.config.shape import world_size
from hpctrain.plan import estimate as plan
from hpctrain.plan.search import alternatives
from tests.support.configs import SEVEN_B, typed


def test_alternatives_fit_are_ranked_and_are_valid_overrides():
    alts = alternatives(typed(*SEVEN_B, "parallel=ddp"), limit=3)
    assert len(alts) == 3
    steps = [a.estimate.time.step_s for a in alts if a.estimate.time is not None]
    assert steps == sorted(steps)
    for alt in alts:
        # The printed overrides, applied to the original command, give a config that validates and fits.
        again = typed(*SEVEN_B, "parallel=ddp", *alt.overrides)
        assert plan.estimate(again).verdict.fits, alt.overrides
        assert world_size(again) == 32
