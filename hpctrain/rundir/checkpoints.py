"""Where checkpoints live and what makes one complete. No torch: the submit side reads this too.

    <run>/checkpoints/step_00000020/   committed: DCP shards, .metadata, config.yaml, manifest.json
    <run>/checkpoints/.tmp-step_00000025/   being written (or abandoned by a crash): never loaded

A checkpoint is committed by renaming its temporary directory once every rank has written its shards and
``manifest.json`` (each file's size and CRC-32) is on disk. A shard's CRC-32 is computed by its writer from
the bytes it wrote (``hpctrain.checkpoint.direct``) and left beside it as ``<shard>.crc32`` until the manifest
takes it, so committing does not read the checkpoint back; a file without one is read to checksum it. A
directory whose files do not match its manifest (a truncated shard, a lost file, a flipped bit) is damaged and
skipped. Manifests of hpctrain before checksums (sizes only) are still checked by size. A checkpoint directory
that is a symbolic link is not one of this run's: auto-resume never follows it out of the run directory.

The manifest also records the checkpoint's lineage: the id of the run history that wrote it (a fresh run
starts one; a resumed run continues the one it loaded). A run prunes only checkpoints of its own lineage and
moves a same-named checkpoint of another lineage aside (``step_N.lineage-<id>``) instead of overwriting it.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from hpctrain.rundir.files import atomic_json

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.json"
PRUNED_PREFIX = TMP_PREFIX + "pruned-"  # a pruned checkpoint being deleted (in the background)
CHECKSUM_SUFFIX = ".crc32"  # beside a shard being committed: {"size": …, "crc32": …} of its bytes


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def config_copy(directory: Path) -> Path:
    """The run's config.yaml as it was when this checkpoint was saved (copied in before the commit)."""
    from hpctrain.rundir import RUN_CONFIG

    return directory / RUN_CONFIG


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under ``root``, newest (highest step) first."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=step_of, reverse=True)


CHUNK = 1 << 20


def crc32(path: Path) -> int:
    """CRC-32 of a file (zlib's, as in zip and gzip), read in 1 MiB chunks."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def write_checksum(path: Path, size: int, checksum: int) -> None:
    """Record the size and CRC-32 of the bytes just written to ``path`` for :func:`write_manifest`."""
    atomic_json(path.with_name(path.name + CHECKSUM_SUFFIX), {"size": size, "crc32": checksum})


def _recorded(path: Path) -> int | None:
    """The CRC-32 recorded by the file's writer, if one was and the file still has the size it recorded."""
    try:
        entry = json.loads(path.with_name(path.name + CHECKSUM_SUFFIX).read_text())
        size, checksum = _expected(entry)
    except (OSError, ValueError):
        return None
    return checksum if size == path.stat().st_size else None


def write_manifest(directory: Path, step: int, **info: Any) -> None:
    """``info``: further facts of the checkpoint (``lineage``: the id of the run history that wrote it;
    ``global_batch_size``), read back by :func:`read_manifest`. Checksums recorded by the writers are taken
    (and their files removed); other files are read to checksum them."""
    records = {p for p in directory.rglob(f"*{CHECKSUM_SUFFIX}") if p.is_file()}
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST and p not in records:
            recorded = _recorded(p)
            files[str(p.relative_to(directory))] = {
                "size": p.stat().st_size,
                "crc32": crc32(p) if recorded is None else recorded,
            }
    for record in records:
        record.unlink()
    manifest = {"format": "hpctrain-checkpoint", "version": 2, "step": step, **info, "files": files}
    atomic_json(directory / MANIFEST, manifest)


def _expected(entry: Any) -> tuple[int, int | None]:
    """(size, crc32) of a manifest entry: version 2 has both, version 1 (a bare int) the size only."""
    if isinstance(entry, bool):
        raise ValueError("not a file entry")
    if isinstance(entry, int):
        return entry, None
    if isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("crc32"), int):
        return entry["size"], entry["crc32"]
    raise ValueError("not a file entry")


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory``; {} when it has none or it cannot be read."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def lineage_of(directory: Path) -> str | None:
    """Which run history wrote ``directory`` (None: written before lineages were recorded)."""
    lineage = read_manifest(directory).get("lineage")
    return lineage if isinstance(lineage, str) else None


def aside_name(directory: Path) -> str:
    """A name to move a committed checkpoint of another lineage to, rather than overwrite it: not a
    ``step_N`` name, so it is neither resumed from nor pruned, and unique."""
    base = f"{directory.name}.lineage-{lineage_of(directory) or 'unknown'}"
    name, n = base, 1
    while (directory.parent / name).exists():
        n += 1
        name = f"{base}.{n}"
    return name


def problem_with(directory: Path) -> str | None:
    """Why ``directory`` cannot be loaded, or None when every file matches its manifest."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (never committed)"
    except (OSError, ValueError) as err:
        return f"unreadable {MANIFEST}: {err}"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} lists no files (not a manifest of this hpctrain)"
    checks = []
    for name, entry in files.items():
        try:
            size, checksum = _expected(entry)
        except ValueError:
            return f"{MANIFEST} has an entry for {name} of the wrong shape"
        path = directory / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{MANIFEST} names {name}, outside the checkpoint"
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes, the manifest says {size}"
        checks.append((name, path, checksum))
    for name, path, checksum in checks:  # sizes first: cheap, and the usual damage
        if checksum is not None and crc32(path) != checksum:
            return f"{name} does not match its checksum (the file changed after it was written)"
    return None


DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a checkpoint's shards


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is one checkpoint: a directory torch.distributed.checkpoint wrote."""
    return (path / DCP_METADATA).is_file()


def checkpoints_of(path: Path) -> list[Path] | None:
    """The committed checkpoints, newest first, of a run directory or of its checkpoints folder; None when
    ``path`` is neither."""
    from hpctrain.rundir import CHECKPOINTS_DIR

    if path.name == CHECKPOINTS_DIR:
        return committed(path)
    if (path / CHECKPOINTS_DIR).is_dir():
        return committed(path / CHECKPOINTS_DIR)
    return None
