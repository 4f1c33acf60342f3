"""The walltime guard (pure): stop when two more steps, 1.5 saves and a margin no longer fit."""

from __future__ import annotations

from hpctrain.resilience.walltime import DEFAULT_SAVE_S, MARGIN_S, should_stop


def test_no_end_time_never_stops():
    assert not should_stop(now=1e9, end_time=None, step_s=100.0, save_s=100.0)


def test_stops_when_the_next_steps_and_a_save_would_not_fit():
    end = 10_000.0
    step_s, save_s = 2.0, 8.0
    needed = 2 * step_s + 1.5 * save_s + MARGIN_S
    assert not should_stop(end - needed - 0.1, end, step_s, save_s)
    assert should_stop(end - needed + 0.1, end, step_s, save_s)


def test_before_the_first_save_assumes_a_generous_one():
    end = 10_000.0
    assert should_stop(end - 1.5 * DEFAULT_SAVE_S - MARGIN_S, end, step_s=0.0, save_s=None)
    assert not should_stop(end - 1.5 * DEFAULT_SAVE_S - MARGIN_S - 1, end, step_s=0.0, save_s=None)
