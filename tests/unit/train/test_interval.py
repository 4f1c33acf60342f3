"""trainer.ckpt_every=auto: Young/Daly's interval and the observed mean time between interruptions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpctrain.train.interval import observed_mtbf_s, young_daly_s


def test_young_daly_interval() -> None:
    # δ = 2 s, M = 1 h: √(2·2·3600) − 2 = 118 s (Daly 2006, first order).
    assert young_daly_s(2.0, 3600.0) == pytest.approx(math.sqrt(14400) - 2)
    assert young_daly_s(10.0, 4.0) == 4.0  # a save longer than 2M: checkpoint every M


def test_observed_mtbf_counts_restarts_and_requeues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert observed_mtbf_s(tmp_path, 86400.0, 1000.0) == (86400.0, "cluster.mtbf_h (no interruption yet)")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 400.0}) + "\n")
    (tmp_path / "restarts.jsonl").write_text(json.dumps({"time": 500.0, "action": "restart"}) + "\n")
    assert observed_mtbf_s(tmp_path, 86400.0, 1000.0)[0] == 600.0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # two requeues of this job as well
    assert observed_mtbf_s(tmp_path, 86400.0, 1000.0)[0] == 200.0
