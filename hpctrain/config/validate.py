"""Reject a bad run before any process starts: every rule raises a one-line ConfigError with the numbers.

Runs on the submitting machine (no torch import). The rules live beside this module, one module per family
(:mod:`hpctrain.config.rules`); this one runs them in a fixed order and returns the run's shape. What needs
more than the config (a built-in dataset, the model's spec) is checked by :mod:`hpctrain.plan.check`.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.rules.checkpoint import check_checkpoint
from hpctrain.config.rules.cluster import check_cluster
from hpctrain.config.rules.parallel import check_parallel
from hpctrain.config.rules.run import (
    check_adapters,
    check_batch,
    check_data_common,
    check_init_from_exists,
    check_logger,
    check_optim,
    check_task,
    check_trainer,
)
from hpctrain.config.sanity import check_finite, check_no_control_characters, check_writable_dir
from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape, run_shape
from hpctrain.faults import check_faults


def validate(cfg: Config, run_dir: str | Path | None = None) -> RunShape:
    """Every rule of every group, in order; the run's shape when none fails."""
    check_no_control_characters(cfg)
    check_finite(cfg)
    check_data_common(cfg.data)
    check_init_from_exists(cfg.model.init_from)
    check_adapters(cfg.model)
    check_task(cfg)
    check_cluster(cfg)
    check_parallel(cfg)
    check_optim(cfg)
    check_trainer(cfg)
    check_checkpoint(cfg)
    check_logger(cfg)
    check_faults(cfg.faults)
    check_batch(cfg)
    if run_dir is not None:
        check_writable_dir("hydra.run.dir", Path(run_dir))
    return run_shape(cfg)
