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

from hpctrain.config.schema import Config
from hpctrain.errors import START_FRESH, CheckpointMismatch
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout

log = logging.getLogger(__name__)

HONOURED = (
    "optim.lr",
    "optim.weight_decay",
    "optim.beta1",
    "optim.beta2",
    "optim.eps",
    "optim.momentum",
    "optim.nesterov",
    "optim.warmup_steps",
    "optim.min_lr_ratio",
    "trainer.max_steps",
)
REFUSED = ("model._target_", "trainer.seed", "optim.name")
# Every key of the data group is refused (the built-ins' name, sizes and split, a user dataset's _target_
# and arguments: they decide which sample an index is) except these, which only decide how batches are made.
DATA_FREE = ("num_workers", "collate")


def config_changes(checkpoint: Path, cfg_file: Path) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, this run's value)} for the keys of HONOURED and REFUSED that differ."""
    saved_file = checkpoint / cfg_file.name
    if not saved_file.is_file():
        return {}
    saved, current = OmegaConf.load(saved_file), OmegaConf.load(cfg_file)
    changes = {}
    data_keys = {*OmegaConf.select(saved, "data", default={}), *OmegaConf.select(current, "data", default={})}
    refused = (*REFUSED, *(f"data.{k}" for k in sorted(data_keys, key=str) if k not in DATA_FREE))
    for key in (*HONOURED, *refused):
        old, new = OmegaConf.select(saved, key), OmegaConf.select(current, key)
        if old is not None and new is not None and old != new:
            changes[key] = (old, new)
    return changes


def check_changes(checkpoint: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    """Refuse (one line) a change that a resumed run cannot honour; log the ones it does."""
    for key, (old, new) in changes.items():
        if key not in HONOURED:
            raise CheckpointMismatch(
                f"{key}={new}: checkpoint {checkpoint} was trained with {key}={old}, which a resumed run "
                f"cannot change; {START_FRESH}"
            )
    honoured = [f"{key} {old} -> {new}" for key, (old, new) in changes.items() if key in HONOURED]
    if honoured:
        log.info("Resume honours the changed config: %s", ", ".join(honoured))


def set_hyperparameters(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, cfg: Config
) -> None:
    """Overwrite what a loaded optimizer and scheduler state says with this run's config (group 0 decays,
    group 1 does not: ``build_optimizer``), and recompute the current lr from the loaded step."""
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
    scheduler._last_lr = lrs  # what get_last_lr() reports until the next step


def keep_global_batch(cfg: Config, run_dir: Path) -> Config:
    """``cfg`` with the global batch of the checkpoint it will resume from, when the user set none."""
    t = cfg.trainer
    if t.global_batch_size is not None or t.resume == "never":
        return cfg
    candidates = layout.committed(RunDir(run_dir).checkpoints) if t.resume == "auto" else [Path(t.resume)]
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
