"""When a step saves (hpctrain.train.monitors.StepMonitors.saves_due): the shared tier every ckpt_every steps,
on the last step and on a stop; the node-local fast tier every checkpoint.local_every steps but the last."""

from __future__ import annotations

from types import SimpleNamespace

from hpctrain.train.monitors import StepMonitors


def _due(step: int, stopping: bool = False, local_every: int | None = 3) -> tuple[bool, bool]:
    monitors = SimpleNamespace(cfg=SimpleNamespace(trainer=SimpleNamespace(max_steps=12, ckpt_every=5)))
    monitors.local_every = local_every
    monitors.auto = None  # trainer.ckpt_every=auto: tests/unit/train/test_interval.py
    return StepMonitors.saves_due(monitors, step, stopping)  # type: ignore[arg-type]


def test_saves_due_by_step_stop_and_tier() -> None:
    assert [s for s in range(1, 13) if _due(s)[0]] == [5, 10, 12]
    assert [s for s in range(1, 13) if _due(s)[1]] == [3, 6, 9]  # not 12: the run ends there
    assert _due(7, stopping=True) == (True, False)
    assert not any(_due(s, local_every=None)[1] for s in range(1, 13))
