"""DCP's file writer, with tensors stored as their raw bytes, written past the page cache and checksummed as
they are written.

Why: DCP's ``FileSystemWriter`` wraps every tensor in a ``torch.save`` archive of its own (a zip with a
pickle), so loading one is a ``torch.load`` per tensor (1,506 for a 10M GPT: loading ran at a tenth of the
disk's speed), and writing one serialises it through Python. Here a tensor is its bytes, contiguous, at a
64-byte aligned offset of the rank's shard (``__<rank>_0.distcp``); DCP's metadata already records each
tensor's dtype and chunk shape, and the storage entry names the format with a transform descriptor
(:data:`RAW`), so a reader that does not know it refuses the checkpoint instead of misreading it
(``hpctrain.checkpoint.reader`` reads it). Non-tensor values stay DCP's own bytes (``torch.save`` of plain
data, read back weights-only).

- A shard goes through :class:`ShardStream`: bytes are gathered in 16 MiB page-aligned buffers that one
  thread checksums (CRC-32C) and another writes with ``O_DIRECT`` while the next is filled (the copy, the
  checksum and the write all release the GIL); a tensor of 1 MiB or more is placed in the file so that its
  4 KiB blocks line up with its memory's and written from its own memory, not copied: a synchronous save
  writes at the disk's speed. The last block
  is padded and the file truncated to its length. Where the file system refuses ``O_DIRECT`` (tmpfs, some
  network file systems) the same stream writes through the page cache; the checksum is the same either way.
  The CRC-32C of the whole shard is left beside it (``<shard>.crc32c``) for the manifest
  (``hpctrain.rundir.checkpoints``): committing reads nothing back.
- ``background=True`` (a save written beside training): the writing thread lowers its own CPU priority to
  nice 19 (Linux schedules threads one by one), so the cores go to training first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import mmap
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpctrain import torchapi
from hpctrain.rundir import checkpoints as layout

RAW = "hpctrain-raw/1"  # a tensor stored as its raw (little-endian, C-contiguous) bytes
ALIGN = 64  # every tensor starts at a multiple: any dtype can be viewed in place from the bytes
BLOCK = 4096  # O_DIRECT wants offsets, lengths and the buffer's address aligned to the logical block size
BUFFER = 16 << 20  # one write per 16 MiB: large sequential writes
OWN_MEMORY = 1 << 20  # a tensor this large is written from its own memory (no copy into a buffer)
NICE = 19


def nice_this_thread() -> None:
    """Lower this thread's CPU priority to nice 19 (who=0: this thread; a sandbox may forbid it)."""
    if hasattr(os, "setpriority") and hasattr(os, "PRIO_PROCESS"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), NICE))


class DirectWriter(FileSystemWriter):
    """``direct=False``: through the page cache (the fast tier's node-local memory, where O_DIRECT means
    nothing). ``progress(bytes)`` is called after each buffer is written (the writer process's test-only
    fault point)."""

    def __init__(
        self,
        path: str | os.PathLike,
        background: bool = False,
        direct: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self.background = background
        self.direct = direct
        self.progress = progress

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self.background:
            nice_this_thread()
        name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        stream = ShardStream(Path(self.path) / name, direct=self.direct, progress=self.progress)
        results = write_items(plan, planner, name, stream)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done


def write_items(plan: SavePlan, planner: SavePlanner, name: str, stream: Any) -> list[WriteResult]:
    """Write a rank's items into its shard ``name`` through ``stream`` (:class:`ShardStream`, or the object
    tier's stream of the same face), in hpctrain's raw format; closed when all are written, abandoned (no
    checksum recorded, never committed) when one fails."""
    results: list[WriteResult] = []
    try:
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                offset = stream.tell()
                stream.write(data.getbuffer())
                info = torchapi.storage_info(name, offset, stream.tell() - offset)
            else:
                assert isinstance(data, torch.Tensor)
                tensor = tensor_bytes(data.detach())
                offset = stream.place(tensor)
                stream.write_tensor(tensor)
                info = torchapi.storage_info(
                    name, offset, stream.tell() - offset, transform_descriptors=[RAW]
                )
            results.append(WriteResult(index=item.index, size_in_bytes=info.length, storage_data=info))
        stream.close()
    except BaseException:
        stream.abandon()
        raise
    return results


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` in C order, as a flat uint8 tensor (a view when it is contiguous on CPU)."""
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


class ShardStream:
    """A write-only file: ``write`` / ``write_tensor`` append, ``tell`` is the logical length, ``close`` makes
    it durable (fsync) and records its size and CRC-32C beside it.

    Three buffers flow through three stages, each its own thread: the caller fills one, a checksum thread
    computes the CRC-32C of the one filled before (in order: the checksum is of the whole file), and a write
    thread writes the one before that. Each stage releases the GIL (torch's copy, ``crc32c``, ``os.write``),
    so on two cores the copy and the checksum run beside the disk's write: the disk sets the pace."""

    STAGES = 3

    def __init__(
        self, path: Path, direct: bool = True, progress: Callable[[int], None] | None = None
    ) -> None:
        self.path = path
        self.progress = progress
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        o_direct = getattr(os, "O_DIRECT", 0) if direct else 0
        try:
            self._fd = os.open(path, flags | o_direct, 0o644)
            self.direct = bool(o_direct)
        except OSError:  # EINVAL: this file system has no O_DIRECT
            self._fd = os.open(path, flags, 0o644)
            self.direct = False
        # Anonymous mappings are page-aligned, as O_DIRECT wants.
        self._maps = [mmap.mmap(-1, BUFFER) for _ in range(self.STAGES)]
        self._buffers = [torch.frombuffer(m, dtype=torch.uint8) for m in self._maps]
        self._free: queue.Queue[int] = queue.Queue()
        for index in range(self.STAGES):
            self._free.put(index)
        self._current = self._free.get()
        self._filled = 0
        self._length = 0
        self._written = 0
        self._crc = 0
        self._error: BaseException | None = None
        # A job: (buffer index, bytes, bytes to write with the padding), or (-1, a tensor's bytes written from
        # its own memory, -1).
        self._to_checksum: queue.Queue[tuple[int, Any, int] | None] = queue.Queue()
        self._to_write: queue.Queue[tuple[int, Any, int] | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._checksum_jobs, name="hpctrain-shard-crc", daemon=True),
            threading.Thread(target=self._write_jobs, name="hpctrain-shard-io", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        self.closed = False

    def tell(self) -> int:
        return self._length

    def write(self, data: Any) -> int:
        """Append bytes (small: DCP's non-tensor values, padding), copied under the GIL."""
        view = memoryview(data).cast("B")
        size = view.nbytes
        done = 0
        while done < size:
            take = min(size - done, BUFFER - self._filled)
            target = memoryview(self._maps[self._current])
            target[self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == BUFFER:
                self._hand_over(BUFFER)
        self._length += size
        return size

    def place(self, source: torch.Tensor) -> int:
        """Pad so that ``source`` (a tensor's bytes, :func:`tensor_bytes`) starts at a 64-byte aligned offset,
        and, when it is large enough to be written from its own memory with ``O_DIRECT``, at an offset that
        shares its address's place within a 4 KiB block (then the blocks of the file and of the memory line
        up); returns that offset."""
        self.pad_to(ALIGN)
        if self.direct and source.numel() >= OWN_MEMORY:
            self.pad_to(BLOCK, source.data_ptr() % BLOCK)
        return self._length

    def write_tensor(self, source: torch.Tensor) -> int:
        """Append a tensor's bytes. A large one (placed by :meth:`place`) is written from its own memory, not
        copied into a buffer: the blocks before and after its aligned middle go through the buffers. The
        tensor must not change until :meth:`close` returns."""
        source = tensor_bytes(source)
        size = source.numel()
        if size >= OWN_MEMORY:
            head = (-source.data_ptr()) % BLOCK if self.direct else 0
            body = (size - head) // BLOCK * BLOCK if self.direct else size
            if not self.direct or (self._length + head) % BLOCK == 0:
                self._copy_in(source[:head])
                if self._filled:  # the file up to here, a whole number of blocks with O_DIRECT
                    self._hand_over(self._filled)
                self._raise_error()
                self._to_checksum.put((-1, source[head : head + body], -1))
                self._length += body
                self._copy_in(source[head + body :])
                return size
        self._copy_in(source)
        return size

    def _copy_in(self, source: torch.Tensor) -> None:
        size = source.numel()
        done = 0
        while done < size:
            take = min(size - done, BUFFER - self._filled)
            self._buffers[self._current][self._filled : self._filled + take].copy_(source[done : done + take])
            self._filled += take
            done += take
            if self._filled == BUFFER:
                self._hand_over(BUFFER)
        self._length += size

    def pad_to(self, align: int, remainder: int = 0) -> None:
        """Pad with zeros until the length is ``remainder`` modulo ``align``."""
        gap = (remainder - self._length) % align
        if gap:
            self.write(bytes(gap))

    def _hand_over(self, size: int, padded: int | None = None) -> None:
        """Pass the current buffer on (checksum, then write) and take the next free one."""
        self._raise_error()
        self._to_checksum.put((self._current, size, padded if padded is not None else size))
        self._current = self._free.get()
        self._raise_error()
        self._filled = 0

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _checksum_jobs(self) -> None:
        while (job := self._to_checksum.get()) is not None:
            index, what, _ = job
            try:
                if self._error is None:
                    with self._view(index, what, what) as part:
                        self._crc = layout.checksum(part, self._crc)
            except BaseException as err:  # re-raised by the filling thread
                self._error = err
            self._to_write.put(job)
        self._to_write.put(None)

    def _write_jobs(self) -> None:
        while (job := self._to_write.get()) is not None:
            index, what, padded = job
            try:
                if self._error is None:
                    with self._view(index, what, padded) as part:
                        self._write_all(part)
                        self._written += part.nbytes
                    if self.progress is not None:
                        self.progress(self._written)
            except BaseException as err:  # re-raised by the filling thread
                self._error = err
            finally:
                if index >= 0:
                    self._free.put(index)

    def _view(self, index: int, what: Any, length: Any) -> memoryview:
        """The bytes of a job: ``length`` bytes of buffer ``index``, or (index -1) a tensor's own."""
        if index < 0:
            return memoryview(what.numpy()).cast("B")
        return memoryview(self._maps[index])[:length]

    def _write_all(self, view: memoryview) -> None:
        written = 0
        while written < view.nbytes:  # os.write may write less than asked (a signal, a full pipe)
            try:
                written += os.write(self._fd, view[written:])
            except OSError as err:
                if not (self.direct and err.errno == errno.EINVAL):
                    raise
                # A file system that accepted O_DIRECT at open but not these writes (a larger block size):
                # the rest goes through the page cache. Linux lets F_SETFL clear O_DIRECT on an open file.
                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._filled:
                tail = self._filled
                padded = -(-tail // BLOCK) * BLOCK if self.direct else tail
                self._buffers[self._current][tail:padded].zero_()
                self._hand_over(tail, padded)
            self._stop_threads()
            self._raise_error()
            # The padding is not part of the file (whether the tail went out with O_DIRECT or not: the I/O
            # thread may have fallen back to the page cache after the padding was decided).
            os.ftruncate(self._fd, self._length)
            os.fsync(self._fd)
        finally:
            self._release()
        layout.write_checksum(self.path, self._length, self._crc)

    def abandon(self) -> None:
        """Close without recording a checksum (the write failed: the checkpoint is never committed)."""
        if not self.closed:
            self._stop_threads()
            self._release()

    def _stop_threads(self) -> None:
        if self._threads[0].is_alive():
            self._to_checksum.put(None)
        for thread in self._threads:
            thread.join()

    def _release(self) -> None:
        self.closed = True
        os.close(self._fd)
        del self._buffers
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
                m.close()
