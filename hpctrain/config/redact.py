"""Secret ``cluster.env`` values: never recorded, passed to the job through the environment. Torch-free.

A ``cluster.env`` name that looks secret (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``, which covers
``WANDB_API_KEY``) has its value replaced by ``***`` wherever a run is recorded: config.yaml, Hydra's
``.hydra/`` files, the job scripts and the W&B config. The real value travels in the environment of the
launching process: the local launcher gives it to its workers, and sbatch (submitit's too) propagates the
submitter's environment to the job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REDACTED = "***"
SECRET_NAME = re.compile(r".*(_KEY|_TOKEN|_SECRET|PASSWORD.*)", re.IGNORECASE)


def is_secret(name: str) -> bool:
    return SECRET_NAME.fullmatch(str(name)) is not None


def secret_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The secret entries of a ``cluster.env`` mapping (real values; never write them anywhere)."""
    return {str(k): str(v) for k, v in env.items() if is_secret(k) and str(v) != REDACTED}


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def redact_config(plain: Any) -> Any:
    """A plain (dict) run config with ``cluster.env``'s secret values replaced; other values unchanged."""
    if not isinstance(plain, dict) or not isinstance(plain.get("cluster"), dict):
        return plain
    env = plain["cluster"].get("env")
    if not isinstance(env, dict):
        return plain
    return {**plain, "cluster": {**plain["cluster"], "env": redact_env(env)}}


def export_secrets(env: Mapping[str, Any]) -> None:
    """Put the secret values into this process's environment, for the job to inherit from the submitter."""
    os.environ.update(secret_env(env))


def redact_files(paths: list[Path], env: Mapping[str, Any]) -> None:
    """Replace every secret value of ``env`` in these text files (Hydra's records of the overrides)."""
    values = sorted({v for v in secret_env(env).values() if v}, key=len, reverse=True)
    if not values:
        return
    from hpctrain.rundir import atomic_write

    for path in paths:
        if not path.is_file():
            continue
        text = original = path.read_text()
        for value in values:
            text = text.replace(value, REDACTED)
        if text != original:
            atomic_write(path, text)
