"""A step's metrics record (hpctrain.train.monitors.StepMonitors.record): due on the logging cadence and at an
evaluation; a skipped (non-finite) step has one always, holding between logging steps only its own loss,
gradient norm and learning rate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from hpctrain.train.monitors import StepMonitors


def _record(step: int, skipped: bool = False) -> dict[str, Any] | None:
    trainer = SimpleNamespace(max_steps=12, eval_every=5, log_interval=lambda: 4)
    monitors = SimpleNamespace(
        cfg=SimpleNamespace(trainer=trainer),
        shape=SimpleNamespace(loss_holders=1),
        stragglers=SimpleNamespace(due=lambda step: False),
        speed=SimpleNamespace(report=lambda: {"tokens_per_s": 1.0}),
        router=None,
    )
    loss, norm = torch.tensor(2.5), torch.tensor(0.5)
    return StepMonitors.record(monitors, step, loss, norm, 1e-3, skipped=skipped)  # type: ignore[arg-type]


def test_a_record_is_due_on_the_cadence_at_evaluations_and_on_every_skipped_step() -> None:
    assert [s for s in range(1, 13) if _record(s) is not None] == [4, 5, 8, 10, 12]
    assert [s for s in range(1, 13) if (_record(s) or {}).get("evaluate")] == [5, 10, 12]
    between = _record(3, skipped=True)
    assert between == {
        "step": 3,
        "loss": 2.5,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "nonfinite": True,
        "evaluate": False,
    }
    on_cadence = _record(4, skipped=True)
    assert on_cadence is not None and on_cadence["nonfinite"] and on_cadence["tokens_per_s"] == 1.0
