"""A resumed run with a changed config (hpctrain.train.overrides): what it honours (lr, schedule, optimizer
hyperparameters) is set into the loaded optimizer and schedule; what it cannot (data, seed, model, optimizer)
is refused in one line; an unset global batch keeps the checkpoint's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from torch import nn

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import write_run_config
from hpctrain.errors import CheckpointMismatch
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.train.optim import build_optimizer, build_scheduler, lr_factor
from hpctrain.train.overrides import check_changes, config_changes, keep_global_batch, set_hyperparameters


def _config(folder: Path, *overrides: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_run_config(folder, compose(list(overrides)))


def test_changes_are_found_honoured_or_refused_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    checkpoint = tmp_path / "step_00000010"
    _config(checkpoint, "optim.lr=1e-3", "trainer.seed=1")
    now = _config(tmp_path / "run", "optim.lr=1e-2", "trainer.seed=1", "data.num_workers=2")
    changes = config_changes(checkpoint, now)
    assert changes == {"optim.lr": (0.001, 0.01)}  # num_workers only decides how batches are made
    with caplog.at_level("INFO", logger="hpctrain.train.overrides"):
        check_changes(checkpoint, changes)
    assert "Resume honours the changed config: optim.lr 0.001 -> 0.01" in caplog.text
    seeded = _config(tmp_path / "seeded", "optim.lr=1e-3", "trainer.seed=2", "data.val_fraction=0.2")
    changes = config_changes(checkpoint, seeded)
    assert set(changes) == {"trainer.seed", "data.val_fraction"}
    with pytest.raises(CheckpointMismatch, match=r"^trainer\.seed=2: checkpoint .* was trained with trainer"):
        check_changes(checkpoint, changes)
    assert config_changes(tmp_path / "no-config-there", now) == {}


def test_honoured_values_are_set_into_the_loaded_optimizer_and_schedule() -> None:
    cfg = to_typed(compose(["optim.lr=1e-3", "optim.warmup_steps=2", "trainer.max_steps=10"]))
    model = nn.Linear(2, 2)
    optimizer = build_optimizer(model, cfg.optim)
    schedule = build_scheduler(optimizer, cfg.optim, 10)
    for _ in range(4):
        optimizer.step()
        schedule.step()
    new = replace(cfg, optim=replace(cfg.optim, lr=1e-2, weight_decay=0.5, beta2=0.9))
    set_hyperparameters(optimizer, schedule, new)
    expected = 1e-2 * lr_factor(4, 2, 10, cfg.optim.min_lr_ratio)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(expected)] * 2
    assert schedule.get_last_lr() == [pytest.approx(expected)] * 2
    assert (
        optimizer.param_groups[0]["weight_decay"] == 0.5 and optimizer.param_groups[1]["weight_decay"] == 0.0
    )
    assert all(g["betas"][1] == 0.9 for g in optimizer.param_groups)


def test_an_unset_global_batch_keeps_the_checkpoints(tmp_path: Path) -> None:
    root = RunDir(tmp_path).checkpoints
    step = root / layout.checkpoint_name(5)
    step.mkdir(parents=True)
    (step / "a.distcp").write_bytes(b"x")
    layout.write_manifest(step, 5, global_batch_size=48)
    cfg = to_typed(compose(["trainer.global_batch_size=null"]))
    assert keep_global_batch(cfg, tmp_path).trainer.global_batch_size == 48
    given = to_typed(compose(["trainer.global_batch_size=32"]))
    assert keep_global_batch(given, tmp_path).trainer.global_batch_size == 32
    fresh = to_typed(compose(["trainer.global_batch_size=null", "trainer.resume=never"]))
    assert keep_global_batch(fresh, tmp_path).trainer.global_batch_size is None
