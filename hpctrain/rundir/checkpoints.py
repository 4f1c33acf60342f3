"""Where checkpoints live and what makes one complete. No torch: the submit side reads this too.

    <run>/checkpoints/step_00000020/   committed: DCP shards, .metadata, config.yaml, manifest.json
    <run>/checkpoints/.tmp-step_00000025/   being written (or abandoned by a crash): never loaded
    <run>/checkpoints/lineage.json     the lineage the run directory's newest run continues (fast tier on)

A checkpoint is committed by renaming its temporary directory once every rank has written its shards and
``manifest.json`` (each file's size and checksum) is on disk. A shard's checksum is computed by its writer
from the bytes it wrote (``hpctrain.checkpoint.direct``) and left beside it as ``<shard>.crc32c`` until the
manifest takes it, so committing does not read the checkpoint back; a file without one is read to checksum
it. A directory whose files do not match its manifest (a truncated shard, a lost file, a flipped bit) is
damaged and skipped. A checkpoint directory that is a symbolic link is not one of this run's: auto-resume
never follows it out of the run directory.

Manifest versions: 3 (this one) records CRC-32C (Castagnoli, RFC 3720), computed by the CPU's own
instruction through the ``crc32c`` package (6 GB/s here, zlib's CRC-32 2 GB/s); 2 recorded zlib's CRC-32; 1
(a bare size per file) sizes only. All three verify. A manifest newer than :data:`MANIFEST_VERSION` is refused
in one line naming both versions, rather than misread (an older hpctrain reading version 3 says so too).

The manifest also records the checkpoint's lineage: the id of the run history that wrote it (a fresh run
starts one; a resumed run continues the one it loaded). A run prunes only checkpoints of its own lineage and
moves a same-named checkpoint of another lineage aside (``step_N.lineage-<id>``) instead of overwriting it.

The fast tier (``checkpoint.local_every``, ``hpctrain.checkpoint.fast``) keeps each rank's newest state in
node-local memory, for restarts inside one job:

    <checkpoint.local_path>/hpctrain-fast-<uid>/<run key>/<job key>/<host>/rank<R>/own/step_N/
    <checkpoint.local_path>/hpctrain-fast-<uid>/<run key>/<job key>/<host>/rank<H>/peer-rank<R>/step_N/

``own``: rank R's copy of its own state; ``peer-rank<R>``: the copy rank H (on another node) holds for rank
R. The run key is derived from the run directory's path, the job key from the Slurm job id and its restart
count (a requeued job is a new job) or, for a local launch, ``HPCTRAIN_JOB_ID`` (:func:`job_identity`), and
the host keys the path because the nodes of a test cluster on one machine share its ``/dev/shm``. Copies are
DCP checkpoints of one rank with a version-3 manifest that also names the run key, the job, the rank, the
world size and the lineage; one of another run, job or lineage is never loaded.

Over 400 lines: what makes a checkpoint complete is one rule read in one place by the submit side and every
rank: its layout, the manifest and its checksums (written, then verified before a load), the newest committed
step, the lineage and the fast tier's paths; a split would put a half of that rule in each file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.rundir.files import atomic_json, read_json
from hpctrain.rundir.objects import ObjectDir

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.json"
MANIFEST_VERSION = 3  # the newest manifest this hpctrain reads (and the one it writes)
PRUNED_PREFIX = TMP_PREFIX + "pruned-"  # a pruned checkpoint being deleted (in the background)
CHECKSUM_SUFFIX = ".crc32c"  # beside a shard being committed: {"size": …, "crc32c": …} of its bytes
LINEAGE_RECORD = "lineage.json"
CHUNK = 8 << 20


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def config_copy(directory: Path) -> Path:
    """The run's config.yaml as it was when this checkpoint was saved (copied in before the commit)."""
    from hpctrain.rundir import RUN_CONFIG

    return directory / RUN_CONFIG


def step_of(path: Path) -> int:
    return int(path.name[len(PREFIX) :])


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under ``root``, newest (highest step) first. ``root`` may be a prefix
    of an object store (:class:`~hpctrain.rundir.objects.ObjectDir`): there a checkpoint is committed once
    its manifest is written, and one listing finds every manifest."""
    if isinstance(root, ObjectDir):
        found = [m.parent for m in root.glob(f"{PREFIX}*/{MANIFEST}")]
        return sorted((p for p in found if p.name[len(PREFIX) :].isdigit()), key=step_of, reverse=True)  # type: ignore[misc]
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()
    ]
    return sorted(found, key=step_of, reverse=True)


def continued(resume: str, root: Path) -> str | Path | None:
    """The checkpoint a run with ``trainer.resume=resume`` continues, as far as the run directory tells before
    anything is read: the one named, or (``auto``) the newest committed under ``root``; None: a fresh start
    (torchtitan's rule, which ``model.init_from`` follows too)."""
    if resume == "never":
        return None
    if resume != "auto":
        return resume
    own = committed(root)
    return own[0] if own else None


def checksum(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like) continuing from ``value``; releases the GIL for large buffers."""
    # Imported where it is used: the package's own import reads its metadata (20-70 ms), and the submit path
    # imports this module (the checkpoint rules) without ever computing a checksum.
    from crc32c import crc32c as crc32c_of

    return int(crc32c_of(data, value))


def crc32c(path: Path) -> int:
    """CRC-32C of a file, read in 8 MiB chunks."""
    value = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            value = checksum(chunk, value)
    return value


def crc32(path: Path) -> int:
    """zlib's CRC-32 of a file (as in zip and gzip): what version-2 manifests record."""
    value = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return value


@dataclass(frozen=True)
class Expected:
    """What a manifest says one file is: its size and, from version 2 on, its checksum (``kind`` names the
    algorithm: ``crc32`` in version 2, ``crc32c`` in version 3)."""

    size: int
    kind: str | None = None
    value: int | None = None

    def update(self, data: Any, value: int) -> int:
        """The running checksum of this kind over ``data``, continuing from ``value``."""
        return checksum(data, value) if self.kind == "crc32c" else zlib.crc32(data, value)

    def matches(self, path: Path) -> bool:
        if self.kind is None:
            return True
        return (crc32c(path) if self.kind == "crc32c" else crc32(path)) == self.value


def checksum_record(size: int, value: int) -> dict[str, int]:
    """What a shard's writer leaves beside it (``<shard>.crc32c``): its size and CRC-32C."""
    return {"size": size, "crc32c": value}


def recorded_crc(entry: Any, size: int) -> int | None:
    """The CRC-32C a writer's record (:func:`checksum_record`, parsed) gives a file of ``size`` bytes; None
    when it is no record or was made for another size."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), int) for k in ("size", "crc32c")):
        return None
    return entry["crc32c"] if entry["size"] == size else None


def manifest_record(step: int, files: dict[str, dict[str, int]], **info: Any) -> dict[str, Any]:
    """A version-:data:`MANIFEST_VERSION` manifest: the step, ``info`` and each file's size and CRC-32C."""
    return {
        "format": "hpctrain-checkpoint",
        "version": MANIFEST_VERSION,
        "step": step,
        **info,
        "files": files,
    }


def write_checksum(path: Path, size: int, value: int) -> None:
    """Record the size and CRC-32C of the bytes just written to ``path`` for :func:`write_manifest`."""
    atomic_json(path.with_name(path.name + CHECKSUM_SUFFIX), checksum_record(size, value))


def _recorded(path: Path) -> int | None:
    """The CRC-32C recorded by the file's writer, if one was and the file still has the size it recorded."""
    return recorded_crc(read_json(path.with_name(path.name + CHECKSUM_SUFFIX)), path.stat().st_size)


def write_manifest(directory: Path, step: int, **info: Any) -> dict[str, Any]:
    """``info``: further facts of the checkpoint (``lineage``: the id of the run history that wrote it;
    ``global_batch_size``; for a fast-tier copy its run, job, rank and world size), read back by
    :func:`read_manifest`. Checksums recorded by the writers are taken (and their files removed); other
    files are read to checksum them. Returns the manifest written."""
    records = {p for p in directory.rglob(f"*{CHECKSUM_SUFFIX}") if p.is_file()}
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST and p not in records:
            recorded = _recorded(p)
            files[str(p.relative_to(directory))] = {
                "size": p.stat().st_size,
                "crc32c": crc32c(p) if recorded is None else recorded,
            }
    for record in records:
        record.unlink()
    manifest = manifest_record(step, files, **info)
    atomic_json(directory / MANIFEST, manifest)
    return manifest


def _expected(entry: Any, version: int) -> Expected:
    """A manifest entry: version 3 {size, crc32c}, version 2 {size, crc32}, version 1 a bare size."""
    if isinstance(entry, bool):
        raise ValueError("not a file entry")
    if isinstance(entry, int) and version <= 2:
        return Expected(entry)
    if isinstance(entry, dict) and isinstance(entry.get("size"), int):
        kind = "crc32c" if version >= 3 else "crc32"
        if isinstance(entry.get(kind), int) and not isinstance(entry.get(kind), bool):
            return Expected(entry["size"], kind, entry[kind])
    raise ValueError("not a file entry")


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory``; {} when it has none or it cannot be read."""
    manifest = read_json(directory / MANIFEST)
    return manifest if isinstance(manifest, dict) else {}


def expected_files(directory: Path) -> tuple[dict[str, Expected], str | None]:
    """Every file the manifest of ``directory`` lists, with what it should be; or ({}, why not)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return {}, f"no {MANIFEST} (never committed)"
    except (OSError, ValueError) as err:
        return {}, f"unreadable {MANIFEST}: {err}"
    if not isinstance(manifest, dict):
        return {}, f"{MANIFEST} is not a manifest of this hpctrain"
    version = manifest.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return {}, f"{MANIFEST} has version {version!r}, not one of 1-{MANIFEST_VERSION}"
    if version > MANIFEST_VERSION:
        return {}, (
            f"{MANIFEST} is version {version}, newer than this hpctrain reads (1-{MANIFEST_VERSION}): "
            f"written by a newer hpctrain; load it with that one"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return {}, f"{MANIFEST} lists no files (not a manifest of this hpctrain)"
    expected: dict[str, Expected] = {}
    for name, entry in files.items():
        try:
            expected[name] = _expected(entry, version)
        except ValueError:
            return {}, f"{MANIFEST} has an entry for {name} of the wrong shape"
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return {}, f"{MANIFEST} names {name}, outside the checkpoint"
    return expected, None


def problem_with(directory: Path, checksums: bool = True) -> str | None:
    """Why ``directory`` cannot be loaded, or None when every file matches its manifest. ``checksums=False``
    checks the manifest and the sizes only: the loader (``hpctrain.checkpoint.reader``) verifies each
    file's checksum as it reads it, before any of its bytes reach the state."""
    expected, problem = expected_files(directory)
    if problem is not None:
        return problem
    for name, entry in expected.items():
        path = directory / name
        if not path.is_file() or path.is_symlink():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != entry.size:
            return f"{name} has {actual} bytes, the manifest says {entry.size}"
    if checksums:  # sizes first: cheap, and the usual damage
        for name, entry in expected.items():
            if not entry.matches(directory / name):
                return f"{name} does not match its checksum (the file changed after it was written)"
    return None


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


def write_lineage(root: Path, lineage: str, job: str | None) -> None:
    """Record the lineage the run directory's current run continues (``checkpoints/lineage.json``): a fast-
    tier copy of another lineage (a run started over with ``trainer.resume=never`` in the same job, another
    run's copy) is never loaded."""
    root.mkdir(parents=True, exist_ok=True)
    atomic_json(root / LINEAGE_RECORD, {"lineage": lineage, "job": job})


def current_lineage(root: Path) -> str | None:
    record = read_json(root / LINEAGE_RECORD)
    lineage = record.get("lineage") if isinstance(record, dict) else None
    return lineage if isinstance(lineage, str) else None


# ------------------------------------------------------------------------------------------- fast tier
# Set by the local launcher for each launch (kept when already set): a restart that keeps it is the same job.
JOB_ID_ENV = "HPCTRAIN_JOB_ID"
FAST_TIER_PREFIX = "hpctrain-fast-"
OWN = "own"
PEER_PREFIX = "peer-rank"
_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def job_identity(environ: Mapping[str, str]) -> str | None:
    """The job whose fast tier a worker may use: an srun task's Slurm job and restart count (a requeued job
    is a new one; a restart inside the allocation keeps both), else the id the local launcher set
    (``HPCTRAIN_JOB_ID``, kept by a restart that keeps the environment). None: started by neither."""
    if "SLURM_PROCID" in environ and environ.get("SLURM_JOB_ID", "").isdigit():
        restarts = environ.get("SLURM_RESTART_COUNT", "0")
        return f"slurm-{environ['SLURM_JOB_ID']}-r{restarts if restarts.isdigit() else 0}"
    given = environ.get(JOB_ID_ENV)
    if given is not None and _JOB_ID.fullmatch(given):
        return f"local-{given}"
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


def checkpoint_around(path: Path) -> Path | None:
    """The checkpoint, or a run's checkpoints folder, that ``path`` is or lies inside (None: neither).
    Nothing there may be written by anything but the checkpoint manager: a file added to a committed
    checkpoint fails its verification, one in checkpoints/ is read as a checkpoint of the run's."""
    from hpctrain.rundir import CHECKPOINTS_DIR, HYDRA_DIR, RUN_CONFIG

    path = Path(path).absolute()
    for folder in (path, *path.parents):
        if is_checkpoint(folder) or (folder / MANIFEST).is_file():
            return folder
        if folder.name == CHECKPOINTS_DIR and folder.parent != folder:
            run = folder.parent
            if (run / RUN_CONFIG).is_file() or (run / HYDRA_DIR).is_dir() or committed(folder):
                return folder
    return None


def valid_job_id(value: str) -> bool:
    return _JOB_ID.fullmatch(value) is not None


def run_key(run_dir: Path) -> str:
    """A short name for a run directory (its resolved path's digest): the fast tier's top level."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FastTierPaths:
    """The node-local paths of one run's fast tier in one job."""

    base: Path  # checkpoint.local_path
    run: str  # run_key(run_dir)
    job: str  # job_identity(...)

    @property
    def user_root(self) -> Path:
        return self.base / f"{FAST_TIER_PREFIX}{os.getuid()}"

    @property
    def run_root(self) -> Path:
        return self.user_root / self.run

    @property
    def job_root(self) -> Path:
        return self.run_root / self.job

    def rank_dir(self, host: str, rank: int) -> Path:
        return self.job_root / _safe_host(host) / f"rank{rank}"

    def own(self, host: str, rank: int) -> Path:
        """Where ``rank`` keeps its own copies on ``host``."""
        return self.rank_dir(host, rank) / OWN

    def held(self, host: str, holder: int, owner: int) -> Path:
        """Where ``holder`` keeps, on ``host``, the copies it holds for ``owner`` (a rank of another node)."""
        return self.rank_dir(host, holder) / f"{PEER_PREFIX}{owner}"

    def make(self, path: Path) -> Path:
        """Create ``path`` (and the user's root, private to the user: other users share /dev/shm)."""
        self.user_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def remove_job(self) -> None:
        """Remove this job's fast tier on this machine (every host directory under it: the nodes of a test
        cluster share it), then the run's directory if nothing else is left in it."""
        shutil.rmtree(self.job_root, ignore_errors=True)
        for parent in (self.run_root, self.user_root):
            with contextlib.suppress(OSError):  # other jobs' or runs' directories left, or already gone
                parent.rmdir()

    def remove_other_jobs(self) -> list[str]:
        """Remove this run's fast tier of any other job (a job of this run that crashed: one run directory
        is used by one run at a time, its lock says so). Returns the job keys removed."""
        removed = []
        if self.run_root.is_dir():
            for job in self.run_root.iterdir():
                if job.name != self.job:
                    shutil.rmtree(job, ignore_errors=True)
                    removed.append(job.name)
        return removed


def copies(directory: Path) -> list[Path]:
    """Committed copies (``step_N``) in a fast-tier directory, newest first."""
    return committed(directory)


def _safe_host(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"
