"""Secret ``cluster.env`` values: never recorded, passed to the job through the environment. Torch-free.

A ``cluster.env`` value is secret by where it comes from, not by how its name is spelt: one taken from the
environment (``cluster.env.DB_PASSWD='${oc.env:DB_PASSWD}'``), or one whose name ``cluster.secret_env``
lists. The usual names of secrets (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``, which covers
``WANDB_API_KEY``) are secret too, as a net. A secret value is replaced by ``***`` wherever a run is
recorded: config.yaml, Hydra's ``.hydra/`` files, the job scripts and the W&B config. The real value travels
in the environment of the launching process: the local launcher gives it to its workers, and sbatch
(submitit's too) propagates the submitter's environment to the job.

Which names are secret is declared once per process, when a config is typed
(:func:`hpctrain.config.typed.to_config` calls :func:`declare_secret`), and config.yaml records the list
(``cluster.secret_env``), so every process of the run, and every later reader, knows them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REDACTED = "***"
SECRET_NAME = re.compile(r".*(_KEY|_TOKEN|_SECRET|PASSWORD.*)", re.IGNORECASE)


_DECLARED: set[str] = set()  # names declared secret in this process (listed, or taken from the environment)
ENV_REFERENCE = re.compile(r"\$\{\s*oc\.env\s*:")


def declare_secret(names: Iterable[str]) -> None:
    """Names whose ``cluster.env`` values are secret in this process from now on (only ever more)."""
    _DECLARED.update(str(n) for n in names)


def is_secret(name: str) -> bool:
    return str(name) in _DECLARED or SECRET_NAME.fullmatch(str(name)) is not None


def env_references(env: Any) -> list[str]:
    """The names of a composed (unresolved) ``cluster.env`` node whose values come from the environment."""
    from omegaconf import DictConfig

    if not isinstance(env, DictConfig):
        return []
    found = []
    for name in env:
        raw = env._get_node(name)._value()  # type: ignore[union-attr]
        if isinstance(raw, str) and ENV_REFERENCE.search(raw):
            found.append(str(name))
    return found


def secret_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The secret entries of a ``cluster.env`` mapping (real values; never write them anywhere)."""
    return {str(k): str(v) for k, v in env.items() if is_secret(k) and str(v) != REDACTED}


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def redact_config(plain: Any) -> Any:
    """A plain (dict) run config with ``cluster.env``'s secret values replaced, and every secret name in
    ``cluster.secret_env`` (so a reader of the file knows them); other values unchanged."""
    if not isinstance(plain, dict) or not isinstance(plain.get("cluster"), dict):
        return plain
    env = plain["cluster"].get("env")
    if not isinstance(env, dict):
        return plain
    listed = plain["cluster"].get("secret_env")
    declare_secret(listed if isinstance(listed, list) else [])
    secret = sorted(str(k) for k in env if is_secret(k))
    cluster = {**plain["cluster"], "env": redact_env(env)}
    if "secret_env" in plain["cluster"] or secret:
        cluster["secret_env"] = sorted({*(listed if isinstance(listed, list) else []), *secret})
    return {**plain, "cluster": cluster}


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
