"""The ETTR projection (hpctrain.plan.ettr): the published failure rates by size, the interval rules as
their papers write them, the Monte Carlo against Daly's closed form, and the plan's line."""

from __future__ import annotations

import math

import pytest

from hpctrain.checkpoint import intervals
from hpctrain.plan import ettr


def test_the_mttf_passes_through_the_published_points_and_follows_their_slopes() -> None:
    assert ettr.mttf_h(8) == pytest.approx(47 * 24)
    assert ettr.mttf_h(1024) == pytest.approx(8.0)
    assert ettr.mttf_h(16384) == pytest.approx(1.8)
    assert ettr.mttf_h(8) > ettr.mttf_h(64) > ettr.mttf_h(1024) > ettr.mttf_h(4096) > ettr.mttf_h(16384)
    # beyond the last point: the last segment's power law
    slope = math.log(1.8 / 8.0) / math.log(16384 / 1024)
    assert ettr.mttf_h(32768) == pytest.approx(1.8 * 2**slope)
    assert ettr.mttf_h(100, ((100, 10.0),)) == 10.0 and ettr.mttf_h(200, ((100, 10.0),)) == 5.0
    with pytest.raises(ValueError):
        ettr.mttf_h(0)


def test_the_monte_carlo_agrees_with_dalys_closed_form() -> None:
    """One fault class of cost R rolling back to the last save: the simulation's mean within 0.3 points
    of Daly's expected ETTR (eq. 20), at a failure rate where the waste is large enough to see."""
    save, mttf, recovery = 20.0, 3600.0, 60.0
    tau = intervals.young_s(save, mttf)
    scenario = ettr.Scenario(tau, save, mttf, (ettr.FaultClass("any", 1.0, recovery),))
    simulated = ettr.expected_ettr(scenario, work_s=20 * 86400, runs=10)
    assert simulated == pytest.approx(intervals.daly_ettr(tau, save, mttf, recovery), abs=0.003)
    # A class that rolls nothing back costs only its recovery.
    skip = ettr.Scenario(tau, save, mttf, (ettr.FaultClass("NaN", 1.0, recovery, rolls_back=False),))
    assert ettr.expected_ettr(skip, 20 * 86400, runs=5) > simulated
    # The same seed, the same answer.
    assert ettr.simulate(scenario, 86400, seed=3) == ettr.simulate(scenario, 86400, seed=3)


def test_recovery_with_spares_beats_requeues_at_scale() -> None:
    mttf = ettr.mttf_h(16384) * ettr.HOUR
    spares = ettr.Scenario(360.0, 10.0, mttf, ettr.hpctrain_classes(6.0, spares=True))
    requeue = ettr.Scenario(360.0, 10.0, mttf, ettr.requeue_only_classes(6.0), queue_wait_mean_s=3600)
    assert ettr.expected_ettr(spares, 10 * 86400, 5) > ettr.expected_ettr(requeue, 10 * 86400, 5) + 0.2


def test_the_plans_line() -> None:
    line = ettr.plan_line(1024, 8_000_000_000, 100.0, spares=True, background=False, step_s=5.0)
    assert line.startswith("ettr      0.9") and "at 1,024 GPUs: MTTF 8.0 h (Kokolis et al.)" in line
    assert (
        "a 89.41 GiB checkpoint saved in 960 ms at cluster.storage_gbps=100" in line
        and "a lost node on a spare" in line
    )
    background = ettr.plan_line(1024, 8_000_000_000, 100.0, spares=False, background=True, step_s=5.0)
    assert "(0.185 of the write, beside training)" in background and "a lost node requeues (1 h" in background
    assert ettr.plan_line(8, 1000, None, True, False, None) == (
        "ettr      not projected: cluster.storage_gbps (the file system's GB/s for the job) is unknown"
    )


def test_a_bad_storage_bandwidth_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from hpctrain.cli import main

    for value, why in (
        ("0", "must be > 0"),
        ("-5", "must be > 0"),
        ("nan", "must be a finite number"),
        ("''", "expected a number or null"),
        ("'1\x01'", "expected a number or null"),
    ):
        assert main(["plan", "model=gpt", "cluster=a100x32", f"cluster.storage_gbps={value}"]) == 2, value
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert captured.out == "" and len(lines) == 1, (value, captured)
        assert lines[0].startswith("hpctrain: cluster.storage_gbps=") and why in lines[0], lines
    assert main(["plan", "model=gpt", "cluster=a100x32", "--top", "0"]) == 0
    assert "ettr      " in capsys.readouterr().out
