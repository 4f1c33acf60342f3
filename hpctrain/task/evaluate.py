"""``hpctrain eval RUN_DIR [--step N] [OVERRIDES]``: the run's own validation of one committed checkpoint, in
one process here (or in a Slurm job of its own), appended to ``RUN_DIR/eval.jsonl``.

The checkpoint is loaded the way a resume loads it (verified first, resharded onto one process), into the
run's model built from its own config.yaml with one process and no parallelism; the global batch is the
checkpoint's. So the result is the number training would have logged as ``val_loss`` at that step (the same
samples; only the summation's grouping differs). Nothing of the run is changed but one appended line of
eval.jsonl: the checkpoint manager works in a scratch directory, so a run training beside it is untouched.

``eval._target_=package.module.function`` (an OVERRIDE of ``hpctrain eval``) evaluates with the user's own
function instead of the run's validation: it is called as ``function(model, data, device)`` with the model
holding the checkpoint's weights (in eval mode, under ``torch.no_grad()``), the run's validation set (the
data's ``val`` split, ``len()`` and ``get_batch(indices)``) and the device, and returns its metrics, a
mapping of name → finite number, written to eval.jsonl beside the step. A name that cannot be imported, an
object that is not callable, a function that raises or returns anything else: one line (with the user's
own traceback above it when their code raised), nothing written.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.config.schema import ParallelConfig
from hpctrain.errors import ConfigError, UserCodeError
from hpctrain.rundir import EVAL_RECORD_FIELDS, RunDir

TARGET_KEY = "eval._target_"
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,99}")
TARGET_HELP = "package.module.function(model, data, device) returning {metric name: number}"


def evaluate_checkpoint(run_dir: Path, step: int | None, overrides: list[str]) -> dict[str, Any]:
    """Evaluate ``run_dir``'s checkpoint of ``step`` (the latest when None) and append the result to its
    eval.jsonl; the record written. ConfigError (one line) for a step never saved or a bad override."""
    from hpctrain.config.io import load_run_config
    from hpctrain.rundir import checkpoints as layout
    from hpctrain.weights.export import checkpoint_of

    run = RunDir(run_dir)
    if not run.config.is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "not a run directory (no config.yaml)")
    target, overrides = split_target(overrides)
    checkpoint = checkpoint_of(run_dir, step)
    cfg = load_run_config(run.config, overrides)
    function = metric_function(target) if target is not None else None
    cfg = dataclasses.replace(
        cfg,
        parallel=ParallelConfig(name="none"),
        cluster=dataclasses.replace(cfg.cluster, kind="local", nproc=1),
        trainer=dataclasses.replace(cfg.trainer, resume=str(checkpoint), async_checkpoint=False),
    )
    metrics, seconds = _evaluate(cfg, run_dir, checkpoint, function and (target, function))
    record: dict[str, Any] = {
        "step": layout.step_of(checkpoint),
        **metrics,
        **({"eval_target": target} if target is not None else {}),
        "eval_batches": cfg.trainer.eval_batches,
        "eval_s": round(seconds, 3),
        "time": time.time(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    run.append_eval(record)
    return record


def split_target(overrides: list[str]) -> tuple[str | None, list[str]]:
    """``eval._target_=NAME`` (the last one given) apart from the overrides of the run's config."""
    target, rest = None, []
    for override in overrides:
        key, sep, value = override.partition("=")
        if key.strip() == TARGET_KEY and sep:
            target = value.strip().strip("'\"")
            if not target:
                raise ConfigError(TARGET_KEY, target, "empty", valid=TARGET_HELP)
        else:
            rest.append(override)
    return target, rest


def metric_function(target: str) -> Callable[..., Any]:
    """The user's metric function ``target`` names (ConfigError, one line, when it cannot be had)."""
    from hpctrain.config.typed import locate

    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", target):
        raise ConfigError(TARGET_KEY, target, "not a dotted name", valid=TARGET_HELP)
    function = locate(TARGET_KEY, target)
    if not callable(function):
        raise ConfigError(
            TARGET_KEY, target, f"is a {type(function).__name__}, not a function", valid=TARGET_HELP
        )
    return function


def checked_metrics(target: str, returned: Any) -> dict[str, float]:
    """What the user's function returned, as eval.jsonl's metrics; ConfigError when it is no mapping of
    metric names to finite numbers (a name of the record's own fields included)."""
    if not isinstance(returned, Mapping) or not returned:
        raise ConfigError(
            TARGET_KEY,
            target,
            f"returned {type(returned).__name__}, not a non-empty mapping",
            valid=TARGET_HELP,
        )
    metrics = {}
    for name, value in returned.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name) or name in EVAL_RECORD_FIELDS:
            valid = f"letters, digits, _ . : / -; not {', '.join(EVAL_RECORD_FIELDS)}"
            raise ConfigError(TARGET_KEY, target, f"returned the metric name {name!r}", valid=valid)
        number = _number(value)
        if number is None or not math.isfinite(number):
            raise ConfigError(TARGET_KEY, target, f"returned {name}={value!r}", valid="a finite number")
        metrics[name] = number
    return metrics


def _number(value: Any) -> float | None:
    """A Python number or a one-element tensor/array as a float; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    count = size() if callable(size) else size
    if count == 1 and hasattr(value, "item"):
        item = value.item()
        return float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else None
    return None


def _evaluate(
    cfg: Any, run_dir: Path, checkpoint: Path, user: tuple[str, Callable[..., Any]] | None = None
) -> tuple[dict[str, float], float]:
    import torch
    import torch.distributed as dist

    from hpctrain.config.shape import run_shape
    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.rendezvous.group import init_distributed
    from hpctrain.train.overrides import keep_global_batch
    from hpctrain.train.trainer import build_run, evaluate

    env = DistEnv(0, 0, 1, 1, "127.0.0.1", _free_port(), socket.gethostname())
    device = init_distributed(env, cfg.cluster.dist_timeout_s)
    scratch = Path(tempfile.mkdtemp(prefix="hpctrain-eval-"))
    try:
        # The checkpoint manager of a scratch run directory (never the run's own, which a running job owns)
        # with the run's config beside it: the resume's config check compares against it.
        shutil.copy(RunDir(run_dir).config, RunDir(scratch).config)
        cfg = keep_global_batch(cfg, scratch)
        started = time.perf_counter()
        built = build_run(cfg, run_shape(cfg), env, device, scratch)
        if user is None:
            metrics = evaluate(built)
        else:
            target, function = user
            model = built.par.model
            model.eval()
            try:
                with torch.no_grad():
                    returned = function(model, built.val_set, device)
            except Exception as err:  # the user's code raised: their traceback, then one line
                raise UserCodeError(TARGET_KEY, target, err) from None
            metrics = checked_metrics(target, returned)
        built.batches.close()
        built.checkpoints.close()
        return metrics, time.perf_counter() - started
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(scratch, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
