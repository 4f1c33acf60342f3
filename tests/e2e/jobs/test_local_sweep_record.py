"""A sweep run here (``-m`` on cluster=local) has its ``sweep.json``, as a Slurm sweep has: one entry per
member (its index, its own overrides, its run directory, job id ``local:N``), added as each member starts,
and ``status`` and ``summary`` read the sweep by it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import FAST, hpctrain

SMALL = [*FAST, "parallel=none", "cluster.nproc=1", "trainer.max_steps=2"]


def test_a_local_sweep_has_its_sweep_json(tmp_path: Path) -> None:
    sweep = tmp_path / "lrs"
    result = hpctrain("-m", "optim.lr=1e-3,3e-4", *SMALL, f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((sweep / "sweep.json").read_text())
    assert record["array_job_id"] == "local" and record["cluster"] == "local"
    members = record["members"]
    assert [m["index"] for m in members] == [0, 1]
    assert [m["run_dir"] for m in members] == [str(sweep / "0"), str(sweep / "1")]
    assert [m["job_id"] for m in members] == ["local:0", "local:1"]
    assert [m["overrides"][0] for m in members] == ["optim.lr=0.001", "optim.lr=0.0003"]
    status = hpctrain("status", str(sweep))
    assert status.returncode == 0, status.stderr
    assert "run here, 2 members (2 COMPLETED)" in status.stdout, status.stdout
    summary = hpctrain("summary", str(sweep))
    assert summary.returncode == 0, summary.stderr
    assert "local:0" in summary.stdout and "local:1" in summary.stdout, summary.stdout
