"""Freeze the code a job will run: the ``hpctrain`` package (with its conf/) as it is at submit time.

A queued job may start hours later; if it imported the package from the working tree then, an edit made
meanwhile would change what it runs. The job puts the snapshot first on its PYTHONPATH instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import hpctrain

SNAPSHOT_DIR = "code"


def snapshot_package(destination_root: Path) -> Path:
    """Copy the package into ``destination_root/code/hpctrain``; return the directory for PYTHONPATH."""
    source = Path(hpctrain.__file__).resolve().parent
    target_root = destination_root / SNAPSHOT_DIR
    target = target_root / "hpctrain"
    if target.exists():
        shutil.rmtree(target)
    # symlinks=False: the top-level conf -> hpctrain/conf link style must not leak into the snapshot.
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target_root
