"""Checks that apply to every value of a config, or to a path, whatever its group. Torch-free.

- No string value may hold a control character (a newline, a carriage return, an escape...): such values
  reach a shell, a path or an ``#SBATCH`` line, where a newline starts a new command or directive.
- No number may be nan or ±inf; a local run may not ask for more processes than the machine can hold, nor
  rendezvous at an address it cannot resolve.
- A run or sweep directory must be one the run can create and write: not ``/``, not under a file, not on a
  read-only or pseudo file system (probed by creating and removing a temporary directory, which works for
  root too, where ``os.access`` says yes to everything).
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpctrain.config.schema import TARGET_GROUPS
from hpctrain.errors import ConfigError


def _control(text: str) -> str | None:
    for ch in text:
        if ord(ch) < 32 or ord(ch) == 127:
            return repr(ch)
    return None


def check_text(key: str, value: str) -> None:
    """Raise ConfigError when ``value`` holds a control character."""
    found = _control(value)
    if found is not None:
        raise ConfigError(
            key,
            value,
            f"contains the control character {found}",
            valid="printable characters only (no newline, tab, carriage return or escape)",
        )


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a typed config (dataclasses, dicts, lists), with its dotted key; a dict's keys too."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            # A target group's arguments are its own keys (model.width, not model.args.width).
            name = {"args": "", "target": "_target_"}.get(f.name, f.name) if key in TARGET_GROUPS else f.name
            yield from leaves(getattr(value, f.name), ".".join(k for k in (key, name) if k))
    elif isinstance(value, dict):
        for name, item in value.items():
            yield f"{key}.{name}", str(name)
            yield from leaves(item, f"{key}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from leaves(item, f"{key}[{i}]")
    else:
        yield key, value


def check_no_control_characters(cfg: Any) -> None:
    for key, value in leaves(cfg):
        if isinstance(value, str):
            check_text(key, value)


def check_finite(cfg: Any) -> None:
    """No number of the config may be nan or ±inf (``optim.lr=inf`` would train nothing but NaNs)."""
    for key, value in leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(key, value, "must be a finite number")


def check_local_cluster(nproc: int, master_addr: str) -> None:
    """``cluster=local``: a process count this machine can hold, and a rendezvous address it can resolve."""
    cap = max(16, 8 * (os.cpu_count() or 1))
    if nproc > cap:
        raise ConfigError(
            "cluster.nproc",
            nproc,
            f"too many local processes for {os.cpu_count()} CPU cores",
            valid=f"1..{cap} (max(16, 8 × cores))",
        )
    try:
        family = socket.getaddrinfo(master_addr, None)[0][0]
    except (OSError, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ConfigError(
            "cluster.master_addr",
            master_addr,
            f"cannot be resolved: {reason}",
            valid="an address or host name of this machine, e.g. 127.0.0.1",
        ) from None
    try:  # resolvable is not enough: rank 0 listens there, so it must be an address of this machine
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((master_addr, 0))
    except (OSError, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ConfigError(
            "cluster.master_addr",
            master_addr,
            f"not an address of this machine: {reason}",
            valid="an address or host name of this machine, e.g. 127.0.0.1",
        ) from None


def check_writable_dir(key: str, path: Path) -> None:
    """``path`` must be creatable and writable: its nearest existing ancestor a writable directory."""
    check_text(key, str(path))
    probe = path.absolute()
    if Path(probe.anchor) == probe.resolve():
        raise ConfigError(key, path, "is the file system root", valid="a directory of its own for the run")
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(key, path, f"cannot create a directory there: {probe} is not a directory")
    try:
        Path(tempfile.mkdtemp(prefix=".hpctrain-probe-", dir=probe)).rmdir()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(key, path, f"cannot create a directory there: {probe}: {reason}") from None


def one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, "not a known choice", valid=", ".join(allowed))


def at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(key, value, f"must be ≥ {low}")
