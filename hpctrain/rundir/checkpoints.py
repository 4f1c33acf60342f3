"""Where checkpoints live and what makes one complete. No torch: the submit side reads this too.

    <run>/checkpoints/step_00000020/   committed: DCP shards, .metadata, config.yaml, manifest.json
    <run>/checkpoints/.tmp-step_00000025/   being written (or abandoned by a crash): never loaded

A checkpoint is committed by renaming its temporary directory once every rank has written its shards and
``manifest.json`` (each file's size) is on disk. A directory whose files do not match its manifest (a
truncated shard, a lost file) is damaged and skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.rundir.files import atomic_json

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.json"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under ``root``, newest (highest step) first."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=step_of, reverse=True)


def write_manifest(directory: Path, step: int) -> None:
    files = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    atomic_json(directory / MANIFEST, {"step": step, "files": files})


def problem_with(directory: Path) -> str | None:
    """Why ``directory`` cannot be loaded, or None when every file matches its manifest."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (never committed)"
    except ValueError as err:
        return f"unreadable {MANIFEST}: {err}"
    for name, size in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes, the manifest says {size}"
    return None
