"""How a file of a run directory is written and read: one atomic write, tolerant line readers. Torch-free.

Every file hpctrain writes into a run directory goes through :func:`atomic_write` (a temporary name in the
same directory, flushed and fsynced, then renamed), so a reader never sees half a file and a crash leaves
the old version. metrics.jsonl is the one file appended to line by line; :func:`read_jsonl` skips a line
that is not whole JSON (a crash mid-write leaves a torn last line) instead of failing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: Path, data: str | bytes | Callable[[IO[bytes]], Any], durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (text, bytes, or a function writing to a binary file) in one rename.

    ``durable`` fsyncs the data before the rename (and the directory after it), so the new content survives
    a power loss; heartbeats, rewritten every second, skip it.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_dir(path.parent)


def atomic_json(path: Path, obj: Any, durable: bool = True, indent: int | None = 1) -> None:
    atomic_write(path, json.dumps(obj, indent=indent), durable=durable)


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or not whole JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(
    path: Path, tail_bytes: int | None = None, head_bytes: int | None = None
) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; with ``tail_bytes``, only those in the end of the file, with
    ``head_bytes`` only those at its start.

    A line that is not a whole JSON object (being written, torn by a crash, or cut by the tail or the head)
    is skipped.
    """
    try:
        with open(path, "rb") as f:
            if tail_bytes is not None:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - tail_bytes))
            data = f.read(head_bytes if head_bytes is not None else -1)
    except OSError:
        return []
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _ends_a_line(path: Path) -> bool:
    """Whether ``path`` is empty or ends with a newline."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class JsonlWriter:
    """Appends one JSON object per line, flushed after each (metrics.jsonl)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: IO[str] | None = None

    def keep_only(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite the file with only the records ``keep`` accepts (and no torn line), atomically; the next
        write appends to the new file (not to the replaced one an open handle still holds)."""
        self.close()
        if not self.path.exists():
            return
        kept = [r for r in read_jsonl(self.path) if keep(r)]
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        if self._out is None:
            self._out = open(self.path, "a")  # noqa: SIM115 - held open across steps, closed by close()
            if not _ends_a_line(self.path):  # a writer killed mid-line: its torn bytes must not take this one
                self._out.write("\n")
        self._out.write(json.dumps(record) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


_PARSED: dict[str, tuple[tuple[int, int, int], Any]] = {}


def load_yaml(path: Path) -> Any:
    """``OmegaConf.load(path)``, the file read and parsed once per process while it is unchanged (its inode,
    mtime and size): a run's config.yaml is read by the worker, its observer and its resume checks, and a
    YAML parse is the slow part (~25 ms). Each call returns a node of its own."""
    from omegaconf import OmegaConf

    stat = os.stat(path)
    key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    hit = _PARSED.get(str(path))
    if hit is None or hit[0] != key:
        plain = OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # interpolations kept as written
        hit = _PARSED[str(path)] = (key, plain)
    return OmegaConf.create(hit[1])
