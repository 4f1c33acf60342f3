"""The shared tier in an object store (``checkpoint.path=s3://bucket/prefix``, any fsspec URL): DCP's shards
written and read through fsspec, in hpctrain's own format, committed by the manifest.

    s3://bucket/prefix/step_00000020/__0_0.distcp, __1_0.distcp, .metadata, config.yaml
    s3://bucket/prefix/step_00000020/manifest.json     written last: the checkpoint is committed

A store has no atomic rename of a folder, so a checkpoint is written in place and committed by one atomic
``PUT`` of its manifest, after every rank's shards and DCP's ``.metadata`` are whole (each object appears
whole or not at all: a multipart upload is invisible until it completes, and one abandoned by a killed rank
never does). A prefix without a manifest is never a committed checkpoint: resume skips it, rank 0 removes it
when the run resumes, and pruning deletes a checkpoint's manifest first, so a prune cut short leaves an
uncommitted prefix, never a committed checkpoint with missing shards. A committed checkpoint this run did not
write, found where its save would go, is copied aside (``step_N.lineage-<id>``, manifest last) before it is
removed: never overwritten.

Each rank writes its shard as one object, streaming (``ObjectStream``: a multipart upload of
:data:`PART`-byte parts), its CRC-32C computed over the bytes as they go and recorded beside it
(``<shard>.crc32c``) for rank 0's manifest, as the file tier does; the manifest is verified on read exactly
as for files: each shard is fetched whole, its size and CRC-32C checked, and only then are its tensors
viewed from the bytes (``hpctrain.checkpoint.reader``). Nothing but tensors and plain data is unpickled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpctrain.checkpoint.direct import ALIGN, nice_this_thread, tensor_bytes, write_items
from hpctrain.checkpoint.reader import CheckpointDamaged, FastReader, _Shard
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import ObjectDir, Store

log = logging.getLogger(__name__)

PART = 32 << 20  # bytes per part of a shard's multipart upload (S3: 5 MiB to 5 GiB, at most 10,000 parts)


class _StoreFS:
    """The file-system face torch's ``FileSystemWriter`` plans with (``mkdir`` before writing), over a store,
    where a prefix needs no making."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def mkdir(self, path: Any) -> None:
        pass

    def concat_path(self, path: Any, suffix: str) -> str:
        return f"{path}/{suffix}"

    def init_path(self, path: Any, **kwargs: Any) -> Any:
        return path

    def exists(self, path: Any) -> bool:
        return bool(self.fs.exists(path))


class ObjectWriter(FileSystemWriter):
    """A DCP storage writer into the prefix ``target`` of a store; ``progress(bytes)`` after each part."""

    def __init__(
        self, target: ObjectDir, background: bool = False, progress: Callable[[int], None] | None = None
    ) -> None:
        super().__init__(str(target), single_file_per_rank=True, sync_files=False, thread_count=1)
        self.target = target
        self.fs = _StoreFS(target.fs)
        self.path = target.key
        self.background = background
        self.progress = progress

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self.background:
            nice_this_thread()
        name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        stream = ObjectStream(self.target / name, progress=self.progress)
        results = write_items(plan, planner, name, stream)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """DCP's metadata, as ``FileSystemWriter.finish`` builds it, in one PUT (no temporary name: an object
        is whole or absent)."""
        storage = {}
        for each in results:
            storage.update({r.index: r.storage_data for r in each})
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        (self.target / layout.DCP_METADATA).write_bytes(pickle.dumps(metadata))


class ObjectStream:
    """A shard written as one object (the face of ``hpctrain.checkpoint.direct.ShardStream``): appended to,
    checksummed as it goes, made visible by :meth:`close` with its size and CRC-32C beside it."""

    def __init__(self, target: ObjectDir, progress: Callable[[int], None] | None = None) -> None:
        self.target = target
        self.progress = progress
        self._file = target.fs.open(target.key, "wb", block_size=PART)
        self._length = 0
        self._crc = 0
        self._reported = 0
        self.closed = False

    def tell(self) -> int:
        return self._length

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._file.write(view)
        self._crc = layout.checksum(view, self._crc)
        self._length += view.nbytes
        if self.progress is not None and self._length - self._reported >= PART:
            self._reported = self._length
            self.progress(self._length)
        return view.nbytes

    def place(self, source: torch.Tensor) -> int:
        self.pad_to(ALIGN)
        return self._length

    def write_tensor(self, source: torch.Tensor) -> int:
        data = tensor_bytes(source)
        view = memoryview(data.numpy()).cast("B")
        for start in range(0, view.nbytes, PART):  # the client copies what it buffers: a part at a time
            self.write(view[start : start + PART])
        return view.nbytes

    def pad_to(self, align: int, remainder: int = 0) -> None:
        gap = (remainder - self._length) % align
        if gap:
            self.write(bytes(gap))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._file.close()  # completes the upload: the object appears whole
        record = layout.checksum_record(self._length, self._crc)
        (self.target.parent / (self.target.name + layout.CHECKSUM_SUFFIX)).write_bytes(
            json.dumps(record).encode()
        )

    def abandon(self) -> None:
        """Give the upload up: nothing of it appears (a multipart upload is aborted)."""
        if not self.closed:
            self.closed = True
            discard = getattr(self._file, "discard", None)
            try:
                if discard is not None:
                    discard()
                else:  # a store whose files cannot be given up: what was written goes at once
                    self._file.close()
                    _rm_quietly(self.target.fs, self.target.key)
            except Exception as err:  # the write failed already: that is the error to raise
                log.debug("abandoning %s: %s", self.target, err)


class ObjectReader(FastReader):
    """:class:`~hpctrain.checkpoint.reader.FastReader` over a store: each shard fetched whole, checked
    against the manifest, then read as from a file."""

    def __init__(
        self, directory: ObjectDir, expected: dict[str, layout.Expected] | None = None, rank: int = 0
    ) -> None:
        if expected is None:
            expected, problem = layout.expected_files(directory)
            if problem is not None:
                raise CheckpointDamaged(problem)
        super().__init__(Path("/nonexistent-object-store-checkpoint"), expected, rank)
        self.directory = directory

    def metadata_bytes(self, rank: int | None) -> bytes:
        return (self.directory / layout.DCP_METADATA).read_bytes()

    def _verified(self, name: str) -> _Shard:
        expected = self.expected.get(name)
        if expected is None:
            raise CheckpointDamaged(f"{name} is not in the manifest")
        try:
            data = (self.directory / name).read_bytes()
        except FileNotFoundError:
            raise CheckpointDamaged(f"{name} is missing") from None
        return _Shard.of_bytes(name, data, expected)


# ------------------------------------------------------------------------------------------ the tier


class ObjectTier:
    """The shared tier's storage in a store (:class:`~hpctrain.checkpoint.tiers.FileTier` is the other)."""

    def __init__(self, root: ObjectDir, store: Store) -> None:
        self.root = root
        self.store = store
        self._deleting: list[threading.Thread] = []

    def final(self, step: int) -> ObjectDir:
        return self.root / layout.checkpoint_name(step)

    def target(self, step: int) -> ObjectDir:
        return self.final(step)  # written in place: the manifest commits it

    def begin(self, step: int, displace: Callable[[Any], None]) -> None:
        """Rank 0, before the ranks write step ``step``: a committed checkpoint there goes first
        (``displace``: removed when this run wrote it, else moved aside), then whatever an earlier attempt
        left."""
        target = self.target(step)
        if (target / layout.MANIFEST).exists():
            displace(target)
        self._remove(target)

    def writer(self, target: Any, background: bool = False, progress: Any = None) -> ObjectWriter:
        return ObjectWriter(target, background=background, progress=progress)

    def commit(
        self, step: int, target: ObjectDir, info: dict[str, Any], config_file: Path | None, displace: Any
    ) -> ObjectDir:
        if config_file is not None:
            (target / config_file.name).write_bytes(config_file.read_bytes())
        write_manifest(target, step, **info)
        return target

    def abandon(self, target: ObjectDir) -> None:
        """What a save that will never be committed wrote, removed; a store that fails this too (it is often
        why the save failed) leaves an uncommitted prefix, which the next resume removes: the save's own
        error is the one to raise, not this one's."""
        try:
            self._remove(target)
        except Exception as err:
            log.warning(
                "Could not remove %s, a save that was not committed (%s): the next resume will", target, err
            )

    def remove(self, checkpoint: ObjectDir) -> None:
        """A committed checkpoint made uncommitted (its manifest first), then deleted."""
        self._remove(checkpoint)

    def move_aside(self, checkpoint: ObjectDir, name: str) -> None:
        """Copy ``checkpoint`` to ``name`` (its manifest last, so the copy is never half a checkpoint), then
        remove it."""
        aside = checkpoint.with_name(name)
        fs = checkpoint.fs
        keys = [k for k in fs.find(checkpoint.key) if not k.endswith("/" + layout.MANIFEST)]
        for key in keys:
            fs.copy(key, aside.key + key[len(checkpoint.key) :])
        fs.copy(f"{checkpoint.key}/{layout.MANIFEST}", f"{aside.key}/{layout.MANIFEST}")
        self._remove(checkpoint)

    def prune(self, old: list[ObjectDir]) -> None:
        """Uncommit each at once (its manifest deleted); delete the rest by a thread."""
        for checkpoint in old:
            _rm_quietly(checkpoint.fs, f"{checkpoint.key}/{layout.MANIFEST}")
        if old:
            deleting = threading.Thread(target=lambda: [self._remove(c) for c in old], daemon=True)
            deleting.start()
            self._deleting.append(deleting)

    def wait(self) -> None:
        for deleting in self._deleting:
            deleting.join()
        self._deleting = []

    def uncommitted(self) -> list[ObjectDir]:
        """``step_N`` prefixes without a manifest: written by a save that never committed."""
        committed = {c.key for c in layout.committed(self.root)}
        return [
            p
            for p in self.root.iterdir()
            if p.name.startswith(layout.PREFIX)
            and p.name[len(layout.PREFIX) :].isdigit()
            and p.key not in committed
        ]

    def _remove(self, prefix: ObjectDir) -> None:
        fs = prefix.fs
        _rm_quietly(fs, f"{prefix.key}/{layout.MANIFEST}")  # uncommitted first
        try:
            keys = fs.find(prefix.key)
            if keys:
                fs.rm(keys)
        except FileNotFoundError:  # removed meanwhile (another rank abandoning the same write)
            return


def _rm_quietly(fs: Any, key: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(key)


def write_manifest(target: ObjectDir, step: int, **info: Any) -> dict[str, Any]:
    """The manifest of the checkpoint under ``target``, from the sizes and checksums its writers recorded
    (a file without a record, such as ``.metadata`` or ``config.yaml``, is read to checksum it); written
    last: the commit."""
    fs = target.fs
    listed = {str(k): int(v.get("size") or 0) for k, v in fs.find(target.key, detail=True).items()}
    records = {k for k in listed if k.endswith(layout.CHECKSUM_SUFFIX)}
    files: dict[str, dict[str, int]] = {}
    for key, size in sorted(listed.items()):
        if key in records or key.endswith("/" + layout.MANIFEST):
            continue
        name = key[len(target.key) + 1 :]
        record = key + layout.CHECKSUM_SUFFIX
        value = layout.recorded_crc(_json(fs.cat_file(record)), size) if record in records else None
        if value is None:
            value = layout.checksum(fs.cat_file(key))
        files[name] = {"size": size, "crc32c": value}
    manifest = layout.manifest_record(step, files, **info)
    (target / layout.MANIFEST).write_bytes(json.dumps(manifest, indent=1).encode())
    if records:
        fs.rm(sorted(records))
    return manifest


def _json(data: bytes) -> Any:
    """A writer's record, or None when it is not whole JSON (read as no record: the file is checksummed)."""
    try:
        return json.loads(data)
    except ValueError:
        return None
