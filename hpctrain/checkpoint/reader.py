"""Loading a checkpoint at the speed of the disk: each shard read once, verified, then every tensor built from
its bytes.

DCP's ``FileSystemReader`` opens a shard and calls ``torch.load`` once per tensor (1,506 calls for a 10M
GPT), then the manifest check read every file a second time for its checksum: loading ran at 0.06-0.11 × a
cold read of the disk. :class:`FastReader` is a DCP ``StorageReader`` whose ``read_data`` maps each shard this
rank needs (``mmap``: the page cache's own pages, no copy into a buffer of ours), asks the kernel to read it
ahead sequentially (``MADV_SEQUENTIAL``, ``MADV_WILLNEED``), computes its checksum over the whole file as
the pages arrive, and only once the file matches its manifest copies each requested piece into the state:
a tensor written by ``hpctrain.checkpoint.direct`` (:data:`~hpctrain.checkpoint.direct.RAW`) is viewed in
place from the bytes with the dtype and chunk shape DCP's metadata records; nothing is unpickled for it. A
thread verifies the next shard while this one is copied out (CRC-32C and torch's copy both release the GIL).
While the first file is checksummed, another thread makes the targets' pages present (:func:`_prefault`:
copying into fresh memory was one page fault per 4 KiB). DCP's planner and metadata still decide what each
rank reads, so a checkpoint reshards across layouts and world sizes as before.

Safety is :mod:`hpctrain.checkpoint.safe`'s: ``.metadata`` through the allow-listed unpickler; non-tensor
values through ``SafeLoadPlanner`` (weights-only); a tensor of a checkpoint written before the raw format
(a ``torch.save`` record) through ``torch.load(weights_only=True)``; any other transform is refused.

Verification is per shard: a file's bytes reach the state only after the whole file matched its checksum.
When a later shard of the same checkpoint fails, the state holds part of it (:attr:`FastReader.touched`):
the checkpoint manager then loads the next candidate, which overwrites every tensor, or has the trainer
build the fresh state again (``hpctrain.checkpoint.manager``).
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from hpctrain import torchapi
from hpctrain.checkpoint.direct import RAW
from hpctrain.checkpoint.safe import SafeFileSystemReader, weights_only
from hpctrain.rundir import checkpoints as layout

CHUNK = 8 << 20  # checksummed 8 MiB at a time: the readahead keeps going meanwhile


class CheckpointDamaged(RuntimeError):
    """A file of the checkpoint does not match its manifest (found while reading it)."""


class FastReader(SafeFileSystemReader):
    """``expected``: the manifest's files (``hpctrain.rundir.checkpoints.expected_files``); read from the
    checkpoint's own manifest when not given. ``rank`` spreads concurrent readers over the shards (each
    starts on another one)."""

    def __init__(
        self, path: str | os.PathLike, expected: dict[str, layout.Expected] | None = None, rank: int = 0
    ) -> None:
        super().__init__(path)
        if expected is None:
            expected, problem = layout.expected_files(Path(path))
            if problem is not None:
                raise CheckpointDamaged(problem)
        self.expected = expected
        self.start_rank = rank
        self.touched = False  # some bytes of this checkpoint were copied into the state
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], torch.dtype]] = {}
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Unpickled once per reader: the checkpoint manager reads it before ``dcp.load``, and DCP reads it
        again (0.09 s each for a 120M GPT's 670 KB through the allow-listed unpickler, 2026-11-27)."""
        if self._metadata is None or kwargs.get("rank") is not None:
            self._metadata = super().read_metadata(*args, **kwargs)
        assert self._metadata.storage_meta is not None  # set by SafeFileSystemReader
        self._metadata.storage_meta.load_id = self.load_id  # DCP may have reset the reader since
        return self._metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for chunk in md.chunks:
                    self._chunks[(fqn, tuple(chunk.offsets))] = (tuple(chunk.sizes), md.properties.dtype)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        names = sorted(per_file)
        if names:  # rank r starts on the r-th shard: concurrent readers do not queue on one file
            shift = self.start_rank % len(names)
            names = names[shift:] + names[:shift]
        targets = [planner.resolve_tensor(item) for item in plan.items if item.type != LoadItemType.BYTE_IO]
        with ThreadPoolExecutor(2, thread_name_prefix="hpctrain-verify") as verifier:
            # Beside the checksum of the first file: the targets' pages made present (see _prefault).
            verifier.submit(_prefault, targets)
            pending = verifier.submit(self._verified, names[0]) if names else None
            for i, name in enumerate(names):
                assert pending is not None
                shard = pending.result()
                pending = verifier.submit(self._verified, names[i + 1]) if i + 1 < len(names) else None
                try:
                    for item in sorted(
                        per_file[name], key=lambda r: self.storage_data[r.storage_index].offset
                    ):
                        self._load_item(shard, item, planner)
                finally:
                    shard.close()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _verified(self, name: str) -> _Shard:
        expected = self.expected.get(name)
        if expected is None:
            raise CheckpointDamaged(f"{name} is not in the manifest")
        return _Shard.open(Path(self.path) / name, name, expected)

    def _load_item(self, shard: _Shard, item: ReadItem, planner: LoadPlanner) -> None:
        info = self.storage_data[item.storage_index]
        fqn = item.storage_index.fqn
        if info.offset < 0 or info.length < 0 or info.offset + info.length > shard.size:
            raise CheckpointDamaged(f"{shard.name}: {fqn} lies outside the file")
        descriptors = tuple(info.transform_descriptors or ())
        if descriptors not in ((), (RAW,)):
            raise CheckpointDamaged(
                f"{fqn} is stored as {', '.join(descriptors)}, which hpctrain does not read"
            )
        piece = shard.whole[info.offset : info.offset + info.length]
        if item.type == LoadItemType.BYTE_IO:
            self.touched = True
            planner.load_bytes(item, io.BytesIO(piece.numpy().tobytes()))
            return
        if descriptors == (RAW,):
            sizes, dtype = self._chunks.get((fqn, tuple(item.storage_index.offset or ())), ((), torch.uint8))
            itemsize = torch.empty((), dtype=dtype).element_size()
            if not sizes and (fqn, tuple(item.storage_index.offset or ())) not in self._chunks:
                raise CheckpointDamaged(f"{fqn}: no chunk in the metadata for its stored piece")
            if math.prod(sizes) * itemsize != info.length:
                raise CheckpointDamaged(
                    f"{fqn}: {info.length} bytes stored, the metadata says {list(sizes)} × {dtype}"
                )
            tensor = piece.view(dtype).reshape(sizes)
        else:  # written before the raw format: a torch.save record, read weights-only
            tensor = weights_only(item, io.BytesIO(piece.numpy().tobytes()))
            if not isinstance(tensor, torch.Tensor):
                raise CheckpointDamaged(f"{fqn}: the stored record is a {type(tensor).__name__}, no tensor")
        tensor = torchapi.narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointDamaged(
                f"{fqn}: stored piece {list(tensor.size())}, wanted {list(target.size())}"
            )
        self.touched = True
        target.copy_(tensor)
        planner.commit_tensor(item, target)


MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a range in, writable, without changing its contents
PREFAULT_MIN = 1 << 20  # a target smaller than this is not worth a system call


def _prefault(targets: list[torch.Tensor]) -> None:
    """Make the pages of the large contiguous targets present (``madvise(MADV_POPULATE_WRITE)``), in a
    thread of the reader while it checksums the first file. Why: a fresh optimizer's state (and any state not
    written yet) is memory the kernel has not given pages to; copying into it took one page fault per 4 KiB
    (a 456 MiB copy 0.5-0.6 s here against 0.12 s into present pages), now taken in one call per tensor and
    beside the checksum. Contents are untouched (present pages are left as they are), so it may run before
    the file is verified; a kernel without it (EINVAL) is left to fault as before."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return
    page = mmap.PAGESIZE
    for target in targets:
        nbytes = target.numel() * target.element_size()
        if nbytes < PREFAULT_MIN or target.device.type != "cpu" or not target.is_contiguous():
            continue
        start = -(-target.data_ptr() // page) * page  # whole pages inside the tensor only
        end = (target.data_ptr() + nbytes) // page * page
        if end > start and madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
            return  # not supported here (or memory it may not touch): the copy faults the pages itself


class _Shard:
    """One verified file, mapped: ``whole`` is its bytes as a uint8 tensor (no copy)."""

    def __init__(self, name: str, size: int, mapping: mmap.mmap | None) -> None:
        self.name = name
        self.size = size
        self._mapping = mapping
        self.whole = (
            torch.frombuffer(mapping, dtype=torch.uint8)
            if mapping is not None
            else torch.empty(0, dtype=torch.uint8)
        )

    @classmethod
    def open(cls, path: Path, name: str, expected: layout.Expected) -> _Shard:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != expected.size:
                raise CheckpointDamaged(f"{name} has {size} bytes, the manifest says {expected.size}")
            if size == 0:
                if expected.kind is not None and expected.update(b"", 0) != expected.value:
                    raise CheckpointDamaged(f"{name} does not match its checksum")
                return cls(name, 0, None)
            # A private mapping is writable (torch wants a writable buffer) but shares the page cache's pages
            # as long as nothing writes to it, and nothing does.
            mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        try:
            if hasattr(mapping, "madvise"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
                mapping.madvise(mmap.MADV_WILLNEED)  # read the whole file ahead, in the background
            if expected.kind is not None:
                view = memoryview(mapping)
                value = 0
                try:
                    for start in range(0, size, CHUNK):
                        value = expected.update(view[start : start + CHUNK], value)
                finally:
                    view.release()
                if value != expected.value:
                    raise CheckpointDamaged(
                        f"{name} does not match its checksum (the file changed after it was written)"
                    )
            return cls(name, size, mapping)
        except BaseException:
            mapping.close()
            raise

    @classmethod
    def of_bytes(cls, name: str, data: bytes, expected: layout.Expected) -> _Shard:
        """A file fetched whole (an object store's), checked as :meth:`open` checks a mapped one."""
        if len(data) != expected.size:
            raise CheckpointDamaged(f"{name} has {len(data)} bytes, the manifest says {expected.size}")
        if expected.kind is not None and expected.update(data, 0) != expected.value:
            raise CheckpointDamaged(
                f"{name} does not match its checksum (the object changed after it was written)"
            )
        shard = cls(name, 0, None)
        shard.size = len(data)
        if data:
            with warnings.catch_warnings():  # read only: torch's note that the buffer is not writable
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                shard.whole = torch.frombuffer(data, dtype=torch.uint8)
        return shard

    def close(self) -> None:
        del self.whole
        if self._mapping is not None:
            with contextlib.suppress(BufferError):  # a tensor viewing it is alive: the mapping goes with it
                self._mapping.close()


class CheckpointNotLoadable(RuntimeError):
    """A checkpoint that is not there whole (missing, uncommitted, damaged), named with what is wrong."""
