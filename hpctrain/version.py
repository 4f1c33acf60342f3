"""hpctrain's version, and the torch and Python it supports, in a module of its own: a room below observe/ can
read it without importing the package root (whose ``log_metrics`` reaches observe/), and the CLI and the
worker can refuse an unsupported environment before anything imports torch or writes a file.

Torch-free and written for any Python 3 (no syntax newer than 3.8 outside annotations): it must still run,
and say so in one line, under the Python it refuses. :mod:`hpctrain.torchapi` checks the torch it imports
against the same range; here the installed torch's version is read from its package metadata.
"""

from __future__ import annotations

import re
import sys

__version__ = "0.1.0"

# The torch and Python hpctrain supports: (lowest, first unsupported), i.e. >=lowest,<top; None: no top yet.
# What the compatibility run passed (.ci/compat, docs/support.md: torch 2.13-2.15 on Python 3.10-3.13,
# 2026-12-06), equal to pyproject.toml's requires-python and torch requirement (tests/unit/test_torch_api.py).
TORCH_SUPPORTED: tuple[str, str | None] = ("2.13", "2.16")
PYTHON_SUPPORTED: tuple[str, str | None] = ("3.10", "3.14")

EXIT_UNSUPPORTED = 2  # the exit status of a CLI command or worker refused for its environment

# A version's release numbers: "2.13.0+cpu", "2.16.0a0+gitabc" and "2.16.0.dev20261201" are placed by
# 2.13.0, 2.16.0 and 2.16.0: a pre-release, nightly or local build counts as the release it leads to.
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


class UnsupportedEnvironment(RuntimeError):
    """The installed torch or the running Python is outside what hpctrain supports. ``str()`` is one line
    naming what is installed and the supported range."""


def release(version: str) -> tuple[int, ...] | None:
    """The release numbers a version string starts with; None when it starts with none."""
    found = _RELEASE.match(version)
    return tuple(int(part) for part in found.group(1).split(".")) if found else None


def spec(supported: tuple[str, str | None]) -> str:
    """The range as a requirement: ``>=2.13,<2.16``."""
    lowest, top = supported
    return f">={lowest}" + (f",<{top}" if top is not None else "")


def within(numbers: tuple[int, ...], supported: tuple[str, str | None]) -> bool:
    """Whether release ``numbers`` lie in ``supported`` (compared padded: 2.13 is 2.13.0)."""
    lowest, top = (release(bound) if bound is not None else None for bound in supported)
    assert lowest is not None

    def padded(parts: tuple[int, ...]) -> tuple[int, ...]:
        return parts + (0,) * (4 - len(parts))

    return padded(lowest) <= padded(numbers) and (top is None or padded(numbers) < padded(top))


def torch_problem(version: str | None, supported: tuple[str, str | None] = TORCH_SUPPORTED) -> str | None:
    """One line when torch ``version`` (None: not installed) is outside ``supported``; None when it is in."""
    wanted = spec(supported)
    install = f"pip install 'torch{wanted}'"
    if version is None:
        return f"hpctrain supports torch {wanted}; this environment has no torch: {install}"
    shown = " ".join(version.split())[:80] or repr(version)  # one line, whatever the metadata held
    numbers = release(version)
    if numbers is None:
        shown += ", not a version"
    elif within(numbers, supported):
        return None
    return f"hpctrain supports torch {wanted}; this environment has torch {shown}: {install}"


def python_problem(
    version_info: tuple[int, ...] = tuple(sys.version_info[:3]),
    supported: tuple[str, str | None] = PYTHON_SUPPORTED,
    executable: str = sys.executable,
) -> str | None:
    """One line when the Python ``version_info`` is outside ``supported``; None when it is in."""
    if within(tuple(version_info[:3]), supported):
        return None
    wanted = spec(supported)
    shown = ".".join(str(part) for part in version_info[:3])
    return (
        f"hpctrain supports Python {wanted}; this is Python {shown} ({executable}): "
        f"make the environment with a Python {wanted}"
    )


def installed_torch() -> str | None:
    """The installed torch's version from its package metadata (torch is not imported); None if none is."""
    from importlib import metadata  # here: every ``import hpctrain`` reads this module, few need metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def environment_problem(need_torch: bool = True) -> str | None:
    """One line when this Python, or (``need_torch``) the installed torch, is not one hpctrain supports."""
    return python_problem() or (torch_problem(installed_torch()) if need_torch else None)
