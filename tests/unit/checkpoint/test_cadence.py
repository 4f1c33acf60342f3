"""When a step saves (hpctrain.checkpoint.cadence): the shared tier every ckpt_every steps, on the last step
and on a stop; the node-local fast tier every checkpoint.local_every steps but the last.
trainer.ckpt_every=auto: Young/Daly's interval, the observed mean time between interruptions, and what an
asynchronous save is charged."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain.checkpoint.cadence import AutoInterval, Cadence, observed_mtbf_s, young_daly_s


def _due(step: int, stopping: bool = False, local_every: int | None = 3) -> tuple[bool, bool]:
    cadence = SimpleNamespace(max_steps=12, every=5, local_every=local_every, auto=None)
    return Cadence.due(cadence, step, stopping)  # type: ignore[arg-type]


def test_saves_due_by_step_stop_and_tier() -> None:
    assert [s for s in range(1, 13) if _due(s)[0]] == [5, 10, 12]
    assert [s for s in range(1, 13) if _due(s)[1]] == [3, 6, 9]  # not 12: the run ends there
    assert _due(7, stopping=True) == (True, False)
    assert not any(_due(s, local_every=None)[1] for s in range(1, 13))


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


def test_an_asynchronous_save_is_charged_what_its_write_cost_the_steps_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first save's stall sets the interval; from the third save on, δ is that save's stall + the steps'
    excess while the one before it was written over the steps after it (the first write, beside a start's
    warm-up, is not measured). Saves written in the foreground keep their δ."""
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    mtbf = 3600.0

    def every(save_s: float, step_s: float) -> int:
        return max(1, round(young_daly_s(save_s, mtbf) / step_s))

    auto = AutoInterval(tmp_path, mtbf, torch.device("cpu"), background=True)
    assert auto.due(1)
    auto.saved(1, 0.5, 0.02)  # the first step of a start is slow; the stall only
    assert auto.every == every(0.02, 0.5)
    for step_s in (0.9, 0.8, 0.7):  # the first write runs beside the start's warm-up: not measured
        auto.step_done(step_s, writing=True)
    auto.saved(1 + auto.every, 0.1, 0.03)
    assert auto.every == every(0.02, 0.5)
    for step_s in (0.2, 0.3, 0.25):  # beside the second write: 0.1 + 0.2 + 0.15 s over the steps after it
        auto.step_done(step_s, writing=True)
    for step_s in (0.1, 0.11, 0.09, 0.1):
        auto.step_done(step_s, writing=False)
    auto.saved(8 + auto.every, 0.1, 0.03)
    assert auto.every == every(0.03 + 0.45, 0.1)
    # Each later save refines it with the write before it (0.05 s over the 0.1 s the steps after it took).
    auto.step_done(0.15, writing=True)
    for step_s in (0.1, 0.1, 0.1):
        auto.step_done(step_s, writing=False)
    auto.saved(30 + auto.every, 0.1, 0.03)
    assert auto.every == every(0.03 + 0.05, 0.1)

    plain = AutoInterval(tmp_path, mtbf, torch.device("cpu"))
    plain.saved(1, 0.1, 0.02)
    plain.step_done(0.4, writing=False)
    plain.saved(1 + plain.every, 0.1, 0.9)
    assert plain.every == every(0.02, 0.1)

    outlasted = AutoInterval(tmp_path, mtbf, torch.device("cpu"), background=True)
    outlasted.saved(1, 0.1, 0.02)
    outlasted.saved(2, 0.1, 0.02)  # the first write: not measured
    for step_s in (0.15, 0.12):  # the second write outlasted the interval: the third save waited for it
        outlasted.step_done(step_s, writing=True)
    outlasted.saved(4, 0.1, 0.7)
    assert outlasted.every == every(0.7 + 0.03, 0.12)
