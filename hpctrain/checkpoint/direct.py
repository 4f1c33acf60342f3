"""DCP's file writer, with the shards written past the page cache and checksummed as they are written.

Why: on this project's reference machine (2 cores, virtio disk) a buffered write of a 1.4 GiB checkpoint cost
5.5 s of CPU (the copy into the page cache and its write-back), as much as the write's wall time: an
asynchronous save running beside training took that CPU from the training step. Written with ``O_DIRECT``
from an aligned buffer the same bytes cost 0.4 s of CPU (bench/checkpoint_stall.py prints both). And the
manifest's CRC-32 of every shard (``hpctrain.rundir.checkpoints``) used to be a second read of the whole
checkpoint at commit, on the training thread; here it is computed from the bytes as they are written and
left beside the shard (``<shard>.crc32``) for the commit to take; torch.save's own per-record CRC, a third
pass, is not computed (``torch.serialization.set_crc32_options``, while the shards are written).

- Shards (``*.distcp``) go through :class:`_DirectStream`: bytes are gathered in a 16 MiB page-aligned
  buffer and written with ``O_DIRECT`` in whole blocks; the last block is padded and the file truncated to
  its length. Where the file system refuses ``O_DIRECT`` (tmpfs, some network file systems) the same stream
  writes through the page cache; the checksum is the same either way.
- ``background=True`` (an asynchronous save): the writer thread lowers its own CPU priority to nice 19
  (Linux schedules threads one by one), so the cores go to training first. A thread cannot raise its
  priority back without privilege, which is why only DCP's per-save writer thread does it, never the
  training thread of a synchronous save.

The format is DCP's own: a checkpoint written here is read by ``FileSystemReader`` like any other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import mmap
import os
import zlib
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from hpctrain.rundir import checkpoints as layout

BLOCK = 4096  # O_DIRECT wants offsets, lengths and the buffer's address aligned to the logical block size
BUFFER = 16 << 20  # one write per 16 MiB: large sequential writes; the copy into it holds the GIL ~2 ms
NICE = 19


class DirectWriter(FileSystemWriter):
    def __init__(self, path: str | os.PathLike, background: bool = False) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self.fs = _ShardFileSystem()
        self.background = background

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.background and hasattr(os, "setpriority") and hasattr(os, "PRIO_PROCESS"):
            # who=0: this thread (on Linux a thread is a task with its own nice value).
            # A sandbox that forbids it: the write still happens, at normal priority.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), NICE))
        # torch.save's zip records carry a CRC-32 of their own: a second pass over every byte (0.8 s of CPU
        # per 1.4 GiB here) that the stream's checksum already covers, and that loading does not need.
        crc_before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            return super().write_data(plan, planner)
        finally:
            torch.serialization.set_crc32_options(crc_before)


class _ShardFileSystem(FileSystem):
    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "wb" or not str(path).endswith(".distcp"):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _DirectStream(Path(path))
        try:
            yield stream
        except BaseException:
            stream.abandon()
            raise
        stream.close()


class _DirectStream(io.RawIOBase):
    """A write-only file: ``write`` appends, ``tell`` is the logical length, ``close`` makes it durable
    (fsync) and records its size and CRC-32 beside it. ``flush`` writes nothing: DCP flushes after every
    tensor, and only whole blocks can go out with ``O_DIRECT``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0)
        try:
            self._fd = os.open(path, flags | direct, 0o644)
            self.direct = bool(direct)
        except OSError:  # EINVAL: this file system has no O_DIRECT
            self._fd = os.open(path, flags, 0o644)
            self.direct = False
        self._buffer = mmap.mmap(-1, BUFFER)  # anonymous mappings are page-aligned
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._length = 0
        self._crc = 0

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self._length

    def flush(self) -> None:
        pass

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        self._crc = zlib.crc32(view, self._crc)  # releases the GIL for large buffers
        done = 0
        while done < size:
            take = min(size - done, BUFFER - self._filled)
            self._view[self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == BUFFER:
                self._drain(BUFFER)
        self._length += size
        return size

    def _drain(self, size: int) -> None:
        written = 0
        while written < size:  # os.write may write less than asked (a signal, a full pipe)
            try:
                written += os.write(self._fd, self._view[written:size])
            except OSError as err:
                if not (self.direct and err.errno == errno.EINVAL):
                    raise
                # A file system that accepted O_DIRECT at open but not these writes (a larger block size):
                # the rest goes through the page cache. Linux lets F_SETFL clear O_DIRECT on an open file.
                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False
        self._filled = 0

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._filled:
                tail = self._filled
                padded = -(-tail // BLOCK) * BLOCK if self.direct else tail
                self._view[tail:padded] = bytes(padded - tail)
                self._drain(padded)
                os.ftruncate(self._fd, self._length)  # the padding is not part of the file
            os.fsync(self._fd)
        finally:
            self._release()
        layout.write_checksum(self.path, self._length, self._crc)

    def abandon(self) -> None:
        """Close without recording a checksum (the write failed: the checkpoint is never committed)."""
        if not self.closed:
            self._release()

    def _release(self) -> None:
        os.close(self._fd)
        self._view.release()
        self._buffer.close()
        super().close()
