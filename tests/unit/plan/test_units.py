"""Issue 29, item 4: the plan's units scale (hpctrain.plan.units): a small model's plan says KiB and µs, never
``0.00 GiB`` or ``0.000 s``, in ``hpctrain plan``, a dry run's line and the alternatives alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.launch.project import PROJECT_DIR_ENV
from hpctrain.plan.units import duration, flop, gpu_time, money, size

# A zero that a unit did not scale: 0.00 GiB, 0.000 s, 0.0 + (a part of the dry run's split), $0.00.
UNSCALED = re.compile(r"(?<![\d.])0\.0+ ?(GiB|MiB|KiB|B|s|ms|µs|PFLOP|GB|GPU-hours|\+|\)|$)|\$0\.00\b", re.M)


def test_each_formatter_picks_the_unit_its_value_needs() -> None:
    assert [size(n) for n in (512, 1600, 0.46 * 2**30, 80 * 2**30)] == [
        "512 B",
        "1.56 KiB",
        "471.04 MiB",
        "80.00 GiB",
    ]
    assert size(104.1 * 2**30, 1) == "104.1 GiB"  # a large model's figure reads as it always did
    assert [duration(s) for s in (0.1, 1.6, 2.03e-5, 125.0, 7300.0, 0.0)] == [
        "100 ms",
        "1.60 s",
        "20.3 µs",
        "2.08 min",
        "2.03 h",
        "0 s",
    ]
    assert (gpu_time(0.27), gpu_time(3.6e-5), gpu_time(1234.5)) == (
        "0.270 GPU-hours",
        "0.130 GPU-seconds",
        "1,234 GPU-hours",
    )
    assert (flop(5.51e9), flop(0.448e15), money(0.53), money(1.2e-5)) == (
        "5.51 GFLOP",
        "448 TFLOP",
        "$0.53",
        "$0.000012",
    )


def test_a_small_model_on_a_large_cluster_prints_no_unscaled_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["model=vit", "parallel=3d", "cluster=a100x32"]
    assert main(["plan", *argv]) == 0
    plan = capsys.readouterr().out
    assert not UNSCALED.findall(plan), plan
    assert re.search(r"  parameters +fp32, sharded +\d+\.\d\d KiB\n", plan), plan
    assert re.search(r"  compute +\d+(\.\d+)? µs  5\.51 GFLOP at", plan), plan
    assert "  GPU memory       a100x32" in plan and "80.00 GiB" in plan  # large figures stay GiB
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PROJECT_DIR_ENV, str(tmp_path))
    assert main([*argv, "dry_run=true"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("plan: ")]
    assert not UNSCALED.findall(line), line
    assert re.search(r"per step, [\d.]+ GPU-seconds, \$0\.000\d+ for 300 steps$", line), line
