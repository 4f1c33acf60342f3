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
from hpctrain.rundir import objects

WRITER_FAILURE = ("warn", "stop")
STORE_URL = "s3://bucket/prefix (any fsspec URL), or null for <run>/checkpoints"


def check_checkpoint(cfg: Config) -> None:
    """The fast tier: an interval ≥ 1 (or none), an absolute node-local path (for a local run, one this
    machine can write; a Slurm node's is checked by the job, with the state's size)."""
    c = cfg.checkpoint
    one_of("checkpoint.on_writer_failure", c.on_writer_failure, WRITER_FAILURE)
    check_store(cfg)
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


def check_store(cfg: Config) -> None:
    """``checkpoint.path``: an object store's URL whose fsspec implementation is installed, and options that
    carry no secret. Whether the store answers (credentials, the bucket) is asked at submit
    (:func:`hpctrain.submit.store.check_store_reachable`)."""
    c = cfg.checkpoint
    for key in c.storage_options:
        if str(key).lower() in objects.SECRET_OPTIONS:
            raise ConfigError(
                f"checkpoint.storage_options.{key}",
                "***",
                "a credential would be recorded in config.yaml and the run's records",
                valid="the store's environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …)",
            )
    if not c.store_timeout_s > 0:
        raise ConfigError(
            "checkpoint.store_timeout_s", c.store_timeout_s, "must be > 0", valid="seconds, e.g. 300"
        )
    if c.path is None:
        if c.storage_options:
            raise ConfigError(
                "checkpoint.storage_options", dict(c.storage_options), "options of no store", valid=STORE_URL
            )
        return
    url = c.path
    if not isinstance(url, str) or not url.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ConfigError("checkpoint.path", url, "not a URL", valid=STORE_URL)
    if not objects.is_url(url):
        raise ConfigError(
            "checkpoint.path",
            url,
            "a folder: the shared checkpoints are in <run>/checkpoints (null); an object store is a URL",
            valid=STORE_URL,
        )
    if cfg.task.name != "train":
        raise ConfigError(
            "checkpoint.path",
            url,
            f"checkpoints are hpctrain's trainer's, not task={cfg.task.name}'s",
            valid="null with task=script",
        )
    scheme = objects.scheme_of(url)
    from fsspec.registry import get_filesystem_class, known_implementations

    if scheme in ("file", "local", "memory") or scheme not in known_implementations:
        valid = "s3, gs, gcs, az, abfs, … (fsspec's, with their package installed)"
        why = "not a store other processes and nodes share" if scheme in ("file", "local", "memory") else None
        raise ConfigError(
            "checkpoint.path", url, why or f"no fsspec file system for {scheme}://", valid=valid
        )
    try:
        get_filesystem_class(scheme)
    except ImportError as err:
        package = known_implementations[scheme].get("class", "").split(".")[0]
        extra = " (pip install 'hpctrain[s3]')" if scheme in ("s3", "s3a") else ""
        raise ConfigError(
            "checkpoint.path", url, f"{scheme}:// needs the package {package}{extra}: {err}", valid=STORE_URL
        ) from None
    rest = url.split("://", 1)[1].strip("/")
    if not rest or ".." in rest.split("/"):
        raise ConfigError("checkpoint.path", url, "names no bucket, or climbs out of it", valid=STORE_URL)
