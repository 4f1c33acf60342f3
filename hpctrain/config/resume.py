"""What a resumed run may change of the config its checkpoint was trained with. Torch-free: the submit side
refuses a change before anything is written, the trainer checks again against the checkpoint it loads.

- Honoured (the user's change wins, like Megatron's ``--override-opt_param-scheduler``): ``optim.lr``,
  ``weight_decay``, ``beta1``/``beta2``, ``eps``, ``momentum``/``nesterov``, ``warmup_steps``,
  ``min_lr_ratio`` and ``trainer.max_steps`` (the schedule's length: it continues from the learning rate
  of the resumed step, :mod:`hpctrain.train.optim`).
- Refused (one line, before training): the data (every key of the group but ``num_workers`` and
  ``collate``: they decide which sample an index is), ``model._target_``, ``trainer.seed``, ``optim.name``.
  Model shapes are checked against the checkpoint's tensors when it is loaded.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

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
# What shapes the learning-rate schedule: a change of these is honoured from the resumed step on.
SCHEDULE_KEYS = ("optim.warmup_steps", "optim.min_lr_ratio", "trainer.max_steps")


def changes_between(saved: DictConfig, current: DictConfig) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, current value)} for the keys of HONOURED and REFUSED (and the data's) that
    differ between two run configs (config.yaml as written, read back with OmegaConf)."""
    changes = {}
    data_keys = {*OmegaConf.select(saved, "data", default={}), *OmegaConf.select(current, "data", default={})}
    refused = (*REFUSED, *(f"data.{k}" for k in sorted(data_keys, key=str) if k not in DATA_FREE))
    for key in (*HONOURED, *refused):
        old, new = OmegaConf.select(saved, key), OmegaConf.select(current, key)
        if old is not None and new is not None and old != new:
            changes[key] = (old, new)
    return changes


def first_refused(changes: dict[str, tuple[Any, Any]]) -> tuple[str, Any, Any] | None:
    """The first change a resumed run cannot honour, as (key, saved value, current value)."""
    for key, (old, new) in changes.items():
        if key not in HONOURED:
            return key, old, new
    return None
