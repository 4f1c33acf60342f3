"""What a resumed run does with a config that differs from the checkpoint's (its ``config.yaml``).

- Honoured (the user's change wins, like Megatron's ``--override-opt_param-scheduler``): ``optim.lr``,
  ``weight_decay``, ``beta1``/``beta2``, ``eps``, ``momentum``/``nesterov``, ``warmup_steps``,
  ``min_lr_ratio`` and ``trainer.max_steps`` (the schedule's length). After the checkpoint is loaded, the
  new values are set into the optimizer's parameter groups and the scheduler's base learning rates, so the
  schedule continues from the loaded step with the new values. One log line lists what was honoured.
- Refused (``CheckpointMismatch``, one line, before training): changes a resumed run cannot honour — the
  data (every key of the group but ``num_workers`` and ``collate``: a built-in's ``name``, sizes and split, a
  user dataset's ``_target_`` and arguments), ``model._target_``, ``trainer.seed``, ``optim.name``.
  Model shapes are checked against the checkpoint's tensors by the checkpoint manager.
- ``trainer.global_batch_size`` left unset: the global batch of the checkpoint is kept (its manifest records
  it), rather than the default of micro-batch × data-parallel size on this world size.
- Everything else (parallel layout, cluster, logging, checkpoint cadence) may change freely.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from hpctrain import torchapi
from hpctrain.config.resume import HONOURED, changes_between, first_refused
from hpctrain.config.schema import Config
from hpctrain.errors import START_FRESH, CheckpointMismatch
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.files import load_yaml

log = logging.getLogger(__name__)


def config_changes(checkpoint: Path, cfg_file: Path) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, this run's value)} for the keys of HONOURED and REFUSED that differ."""
    saved_file = layout.config_copy(checkpoint)
    if not saved_file.is_file():
        return {}
    # read_text: a file, or an object of a store (checkpoint.path)
    return changes_between(OmegaConf.create(saved_file.read_text()), load_yaml(cfg_file))


def check_changes(checkpoint: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    """Refuse (one line) a change that a resumed run cannot honour; log the ones it does."""
    refused = first_refused(changes)
    if refused is not None:
        key, old, new = refused
        raise CheckpointMismatch(
            f"{key}={new}: checkpoint {checkpoint} was trained with {key}={old}, which a resumed run "
            f"cannot change; {START_FRESH}"
        )
    honoured = [f"{key} {old} -> {new}" for key, (old, new) in changes.items() if key in HONOURED]
    if honoured:
        log.info("Resume honours the changed config: %s", ", ".join(honoured))


def continue_schedule(
    scheduler: torch.optim.lr_scheduler.LambdaLR, checkpoint: Path
) -> tuple[int, float] | None:
    """Make the schedule go on from the loaded step without a jump; the anchor to record in later
    checkpoints' manifests (None: the schedule is as configured).

    The checkpoint's manifest holds the anchor of an earlier change, its config.yaml the schedule it was
    trained with. When this run's schedule (max_steps, warmup, floor) gives another factor at the loaded
    step, past the warmup, the lr decays from the factor it had there to the floor at the new max_steps
    (:class:`hpctrain.train.optim.Schedule`); within the warmup, the new warmup applies as written."""
    from hpctrain.train.optim import Schedule, schedule_of

    schedule = schedule_of(scheduler)
    saved_anchor = layout.read_manifest(checkpoint).get("lr_anchor")
    if isinstance(saved_anchor, list) and len(saved_anchor) == 2:
        schedule.anchor_step, schedule.anchor_factor = int(saved_anchor[0]), float(saved_anchor[1])
    step = scheduler.last_epoch
    saved_file = layout.config_copy(checkpoint)
    if not saved_file.is_file() or step < schedule.warmup_steps:
        return _anchor(schedule)
    saved = OmegaConf.create(saved_file.read_text())  # a file, or an object of a store
    before = Schedule(
        int(OmegaConf.select(saved, "optim.warmup_steps", default=schedule.warmup_steps)),
        int(OmegaConf.select(saved, "trainer.max_steps", default=schedule.total_steps)),
        float(OmegaConf.select(saved, "optim.min_lr_ratio", default=schedule.min_ratio)),
        schedule.anchor_step,
        schedule.anchor_factor,
    )
    was, now = before(step), schedule(step)
    if abs(was - now) > 1e-12 * max(1.0, abs(was)):
        schedule.anchor_step, schedule.anchor_factor = step, was
        log.info(
            "The schedule changed at step %d: the lr goes on from %.4g × optim.lr there, down to %.4g × at "
            "step %d (it would have jumped to %.4g ×)",
            step,
            was,
            schedule.min_ratio,
            schedule.total_steps,
            now,
        )
    return _anchor(schedule)


def _anchor(schedule: Any) -> tuple[int, float] | None:
    return None if schedule.anchor_step is None else (schedule.anchor_step, schedule.anchor_factor)


def set_hyperparameters(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    cfg: Config,
    checkpoint: Path | None = None,
) -> tuple[int, float] | None:
    """Overwrite what a loaded optimizer and scheduler state says with this run's config (group 0 decays,
    group 1 does not: ``build_optimizer``), continue the schedule from the loaded step
    (:func:`continue_schedule`, when the ``checkpoint`` is given: its anchor is returned), and recompute
    the current lr from the loaded step."""
    anchor = continue_schedule(scheduler, checkpoint) if checkpoint is not None else None
    optim = cfg.optim
    for i, group in enumerate(optimizer.param_groups):
        group["initial_lr"] = optim.lr
        if i == 0:
            group["weight_decay"] = optim.weight_decay
        if "betas" in group:
            group["betas"] = (optim.beta1, optim.beta2)
            group["eps"] = optim.eps
        if "momentum" in group:
            group["momentum"] = optim.momentum
            group["nesterov"] = optim.nesterov
    scheduler.base_lrs = [optim.lr for _ in optimizer.param_groups]
    step = scheduler.last_epoch
    lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    torchapi.set_last_lr(scheduler, lrs)
    return anchor


def keep_global_batch(cfg: Config, run_dir: Path) -> Config:
    """``cfg`` with the global batch of the checkpoint it will resume from, when the user set none."""
    t = cfg.trainer
    if t.global_batch_size is not None or t.resume == "never":
        return cfg
    candidates = (
        layout.committed(RunDir(run_dir).shared_checkpoints) if t.resume == "auto" else [Path(t.resume)]
    )
    for candidate in candidates:
        # Sizes only: reading every file for its checksum here would read the checkpoint twice per resume.
        if layout.problem_with(candidate, checksums=False) is None:
            saved = layout.read_manifest(candidate).get("global_batch_size")
            if not isinstance(saved, int):
                return cfg
            log.info(
                "trainer.global_batch_size is unset: keeping %d, the global batch of %s",
                saved,
                candidate.name,
            )
            return dataclasses.replace(cfg, trainer=dataclasses.replace(t, global_batch_size=saved))
    return cfg
