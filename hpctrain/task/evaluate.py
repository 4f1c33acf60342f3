"""``hpctrain eval RUN_DIR [--step N] [OVERRIDES]``: the run's own validation of one committed checkpoint, in
one process here (or in a Slurm job of its own), appended to ``RUN_DIR/eval.jsonl``.

The checkpoint is loaded the way a resume loads it (verified first, resharded onto one process), into the
run's model built from its own config.yaml with one process and no parallelism; the global batch is the
checkpoint's. So the result is the number training would have logged as ``val_loss`` at that step (the same
samples; only the summation's grouping differs). Nothing of the run is changed but one appended line of
eval.jsonl: the checkpoint manager works in a scratch directory, so a run training beside it is untouched.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from hpctrain.config.schema import ParallelConfig
from hpctrain.errors import ConfigError
from hpctrain.rundir import RunDir


def evaluate_checkpoint(run_dir: Path, step: int | None, overrides: list[str]) -> dict[str, Any]:
    """Evaluate ``run_dir``'s checkpoint of ``step`` (the latest when None) and append the result to its
    eval.jsonl; the record written. ConfigError (one line) for a step never saved or a bad override."""
    from hpctrain.config.io import load_run_config
    from hpctrain.rundir import checkpoints as layout
    from hpctrain.weights.export import checkpoint_of

    run = RunDir(run_dir)
    if not run.config.is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "not a run directory (no config.yaml)")
    checkpoint = checkpoint_of(run_dir, step)
    cfg = load_run_config(run.config, overrides)
    cfg = dataclasses.replace(
        cfg,
        parallel=ParallelConfig(name="none"),
        cluster=dataclasses.replace(cfg.cluster, kind="local", nproc=1),
        trainer=dataclasses.replace(cfg.trainer, resume=str(checkpoint), async_checkpoint=False),
    )
    metrics, seconds = _evaluate(cfg, run_dir, checkpoint)
    record: dict[str, Any] = {
        "step": layout.step_of(checkpoint),
        **metrics,
        "eval_batches": cfg.trainer.eval_batches,
        "eval_s": round(seconds, 3),
        "time": time.time(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    run.append_eval(record)
    return record


def _evaluate(cfg: Any, run_dir: Path, checkpoint: Path) -> tuple[dict[str, float], float]:
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
        metrics = evaluate(built)
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
