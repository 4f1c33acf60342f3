"""Secret ``cluster.env`` values: never recorded, passed to the job through the environment. Torch-free.

A ``cluster.env`` value is secret by where it comes from: one taken from the environment
(``cluster.env.DB_PASSWD='${oc.env:DB_PASSWD}'``), or one whose name ``cluster.secret_env`` lists; and by its
name, whatever its source (typed, a YAML file): a name with a part that names a secret (``PASSWD``, ``PASS``,
``PWD``, ``SECRET``, ``TOKEN``, ``KEY``, ``CREDENTIAL``, any case, between ``_``, ``-``, ``.`` or a change of
case: ``DB_PASSWD``, ``WANDB_API_KEY``, ``dbToken``), or ``PASSWORD`` anywhere in it. A secret value is
replaced by ``***`` wherever a run is recorded: config.yaml, Hydra's ``.hydra/`` files, the job scripts and
the W&B config. One typed on the command line never even reaches Hydra: :func:`secret_overrides` puts it in
this process's environment and hands Hydra ``${oc.env:NAME}`` instead, so no record, log line or sweep
listing can hold it. The real value travels in the environment of the launching process: the local launcher
gives it to its workers, and sbatch (submitit's too) propagates the submitter's environment to the job.

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
# The parts of a name that make it a secret's (a part: between _, -, . or a change of case, any case).
SECRET_PARTS = frozenset(
    {
        "PASSWD",
        "PASS",
        "PWD",
        "PASSWORD",
        "PASSPHRASE",
        "SECRET",
        "SECRETS",
        "TOKEN",
        "TOKENS",
        "KEY",
        "KEYS",
        "CREDENTIAL",
        "CREDENTIALS",
    }
)
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
ENV_KEY = "cluster.env."


_DECLARED: set[str] = set()  # names declared secret in this process (listed, or taken from the environment)
ENV_REFERENCE = re.compile(r"\$\{\s*oc\.env\s*:")


def declare_secret(names: Iterable[str]) -> None:
    """Names whose ``cluster.env`` values are secret in this process from now on (only ever more)."""
    _DECLARED.update(str(n) for n in names)


def is_secret(name: str) -> bool:
    name = str(name)
    if name in _DECLARED or SECRET_NAME.fullmatch(name) is not None:
        return True
    return any(part.upper() in SECRET_PARTS for part in _PART.findall(name))


def secret_overrides(overrides: list[str]) -> list[str]:
    """``overrides`` with every typed secret ``cluster.env`` value (``+cluster.env.DB_PASSWD=...``) moved into
    this process's environment and replaced by ``${oc.env:NAME}``: Hydra, and so every record it or hpctrain
    writes (config.yaml, .hydra/, multirun.yaml, sweep.json, logs, the console), never holds the value,
    while the job still gets it (the launchers pass this process's environment on). A sweep over secret
    values is refused: its members could only differ by what is never recorded."""
    from hpctrain.errors import ConfigError

    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        name = key.lstrip("+~")[len(ENV_KEY) :] if key.lstrip("+~").startswith(ENV_KEY) else ""
        if not sep or not name or "." in name or not is_secret(name) or ENV_REFERENCE.search(value):
            out.append(text)
            continue
        if _is_sweep(text):
            raise ConfigError(
                key.lstrip("+~"),
                REDACTED,
                "a secret cannot be swept (its value is never recorded)",
                valid=f"one value: {key}=VALUE",
            )
        os.environ[name] = _unquoted(value)
        out.append(f"{key}=${{oc.env:{name}}}")
    return out


def _is_sweep(text: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return bool(OverridesParser.create().parse_override(text).is_sweep_override())
    except Exception:  # Hydra's grammar refuses it: compose says so in its own line
        return False


def _unquoted(value: str) -> str:
    """The value as Hydra would have read it: one pair of quotes around it taken away."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


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
