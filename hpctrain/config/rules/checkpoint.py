"""The checkpoint group's rules: the node-local fast tier (its interval and path) and what a writer process
that dies leads to. Torch-free."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hpctrain.config.sanity import one_of
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.rundir import checkpoints as checkpoint_layout

WRITER_FAILURE = ("warn", "stop")


def check_checkpoint(cfg: Config) -> None:
    """The fast tier: an interval ≥ 1 (or none), an absolute node-local path (for a local run, one this
    machine can write; a Slurm node's is checked by the job, with the state's size)."""
    c = cfg.checkpoint
    one_of("checkpoint.on_writer_failure", c.on_writer_failure, WRITER_FAILURE)
    given = os.environ.get(checkpoint_layout.JOB_ID_ENV)
    if given is not None and not checkpoint_layout.valid_job_id(given):
        raise ConfigError(
            checkpoint_layout.JOB_ID_ENV, given, "not a job id", valid="1-64 characters of A-Z a-z 0-9 . _ -"
        )
    if c.local_every is None:
        return
    if c.local_every < 1:
        raise ConfigError(
            "checkpoint.local_every",
            c.local_every,
            "must be ≥ 1 (steps between fast-tier copies)",
            valid="e.g. 10, or null to keep no fast tier",
        )
    if cfg.task.name != "train":
        raise ConfigError(
            "checkpoint.local_every",
            c.local_every,
            f"the fast tier is hpctrain's trainer's, not task={cfg.task.name}'s",
            valid="null with task=script",
        )
    path = Path(c.local_path)
    if not c.local_path or not path.is_absolute():
        raise ConfigError(
            "checkpoint.local_path",
            c.local_path,
            "must be an absolute path (a node-local directory)",
            valid="e.g. /dev/shm",
        )
    if cfg.cluster.kind == "local":
        valid = "an existing writable node-local directory, e.g. /dev/shm"
        if not path.is_dir():
            raise ConfigError("checkpoint.local_path", c.local_path, "is not a directory here", valid=valid)
        try:
            Path(tempfile.mkdtemp(prefix=".hpctrain-probe-", dir=path)).rmdir()
        except OSError as err:
            reason = f"not writable: {err.strerror or err}"
            raise ConfigError("checkpoint.local_path", c.local_path, reason, valid=valid) from None
