"""Issue 6: a straggler is named in the metrics (hpctrain.observe.stragglers), on 2 real ranks.
(A profiler window: tests/e2e/observe/test_profile.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import FAST, hpctrain, metrics


def test_an_injected_straggler_is_named_in_the_metrics(run_dir: Path):
    result = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=6",
        "trainer.log_every=3",
        "trainer.straggler_every=3",
        "faults.slow_rank=0:0.3",  # rank 0 sleeps 0.3 s in the data phase of every step
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [r for r in metrics(run_dir) if "straggler_rank" in r]
    assert [r["step"] for r in reports] == [3, 6]
    hosts = {entry["rank"]: entry["host"] for entry in json.loads((run_dir / "ranks.json").read_text())}
    for report in reports:
        assert report["straggler_rank"] == 0, report
        assert report["straggler_host"] == hosts[0]
        assert report["straggler_phase"] == "data"
        assert report["data_s_max"] >= 0.3
        assert report["straggler_slowdown"] > 1.5
        # Rank 0 logs its own wait for batches, inside its step time (issue 18: data never waits).
        assert 0.3 <= report["data_wait_s"] <= report["step_time_s"], report
        # The throughput metrics beside it: per device too, and this rank's peak memory.
        per_device, total = report["tokens_per_s_per_device"], report["tokens_per_s"]
        assert abs(per_device - total / 2) < 1e-6 * total
        assert 0.05 < report["peak_mem_gib"] < 8
    assert "Straggler: rank 0" in (run_dir / "logs" / "rank0.log").read_text()


def test_without_a_straggler_the_slowdown_stays_small(run_dir: Path):
    result = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=4",
        "trainer.straggler_every=4",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = [r for r in metrics(run_dir) if "straggler_rank" in r]
    assert report["data_s_max"] < 0.1, report
    assert 0 <= report["data_wait_s"] < 0.1, report
    # Twice the median of a fraction of a millisecond is no straggler worth a warning (the 10 ms floor).
    assert "Straggler:" not in (run_dir / "logs" / "rank0.log").read_text()
