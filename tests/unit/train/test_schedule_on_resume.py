"""Issue 29, item 2: a schedule changed on resume (trainer.max_steps, warmup, floor) is honoured from the
resumed step: the lr goes on from where it was, never jumps, and the anchor survives a later resume."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from hpctrain.config.schema import OptimConfig
from hpctrain.rundir import checkpoints as layout
from hpctrain.train.optim import build_scheduler, lr_factor
from hpctrain.train.overrides import continue_schedule


def _checkpoint(root: Path, step: int, max_steps: int, anchor: list[float] | None = None) -> Path:
    directory = root / layout.checkpoint_name(step)
    directory.mkdir(parents=True)
    layout.config_copy(directory).write_text(
        f"optim:\n  warmup_steps: 2\n  min_lr_ratio: 0.1\ntrainer:\n  max_steps: {max_steps}\n"
    )
    layout.write_manifest(directory, step, **({"lr_anchor": anchor} if anchor else {}))
    return directory


def _scheduler(max_steps: int, at: int) -> torch.optim.lr_scheduler.LambdaLR:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, OptimConfig(warmup_steps=2, min_lr_ratio=0.1), max_steps)
    scheduler.last_epoch = at  # as loaded from a checkpoint of step ``at``
    return scheduler


def test_a_longer_schedule_goes_on_from_the_resumed_lr_down_to_its_floor(tmp_path: Path):
    checkpoint = _checkpoint(tmp_path, 5, max_steps=10)
    was = lr_factor(5, 2, 10, 0.1)
    scheduler = _scheduler(20, at=5)
    assert continue_schedule(scheduler, checkpoint) == (5, pytest.approx(was))
    factor = scheduler.lr_lambdas[0]
    assert factor(5) == pytest.approx(was)  # no jump (the plain schedule would give lr_factor(5, 2, 20))
    assert abs(lr_factor(5, 2, 20, 0.1) - was) > 0.1
    values = [factor(s) for s in range(5, 21)]
    assert all(a >= b for a, b in itertools.pairwise(values)) and values[-1] == pytest.approx(0.1)
    assert factor(12) == pytest.approx(0.1 + (was - 0.1) * 0.5 * (1 + math.cos(math.pi * 7 / 15)))


def test_the_anchor_survives_a_later_resume_with_the_same_schedule(tmp_path: Path):
    first = _scheduler(20, at=5)
    continue_schedule(first, _checkpoint(tmp_path / "a", 5, max_steps=10))
    expected = first.lr_lambdas[0](9)
    later = _scheduler(20, at=9)
    anchor = continue_schedule(
        later, _checkpoint(tmp_path / "b", 9, max_steps=20, anchor=[5, lr_factor(5, 2, 10, 0.1)])
    )
    assert anchor == (5, pytest.approx(lr_factor(5, 2, 10, 0.1)))
    assert later.lr_lambdas[0](9) == pytest.approx(expected)


def test_an_unchanged_schedule_is_left_as_configured(tmp_path: Path):
    scheduler = _scheduler(10, at=5)
    assert continue_schedule(scheduler, _checkpoint(tmp_path, 5, max_steps=10)) is None
    assert scheduler.lr_lambdas[0](7) == lr_factor(7, 2, 10, 0.1)
