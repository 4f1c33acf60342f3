"""Token files: ``<name>.bin`` (raw little-endian token ids) plus a ``<name>.json`` header.

The layout nanoGPT reads: ``np.memmap("<name>.bin", dtype=np.uint16)`` gives the ids when the vocabulary
fits (V ≤ 65536), else they are uint32. The header is ``{"format": "hpctrain-tokens", "version": 2,
"dtype": "uint16", "vocab_size": V, "num_tokens": N, "tokenizer": ...}`` (see
:data:`hpctrain.data.catalog.TOKEN_VERSION`; version-1 headers, without "tokenizer", are still read). A
trained or given tokenizer lies beside the .bin as ``<name>.tokenizer.json``. Files are read through a
read-only ``np.memmap`` so every rank shares the page cache instead of holding its own copy.

Writing is incremental (:class:`TokenWriter`): ids are appended to a hidden temporary file, which is renamed
into place when complete, and the header is written last, atomically; a header on disk therefore always
describes a complete .bin, and an interrupted write leaves the previous files (or none) behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from hpctrain.data.catalog import TOKEN_FORMAT as FORMAT
from hpctrain.data.catalog import TOKEN_VERSION as VERSION
from hpctrain.data.catalog import read_token_header as read_header
from hpctrain.rundir.files import atomic_write, fsync_dir

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def header_path(path: str | Path) -> Path:
    return Path(path).with_suffix(".json")


def tokenizer_path(path: str | Path) -> Path:
    """Where the tokenizer of token file ``path`` (``<name>.bin``) is saved: ``<name>.tokenizer.json``."""
    return Path(path).with_suffix(".tokenizer.json")


def dtype_for_vocab(vocab_size: int) -> str:
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be at least 1")
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise ValueError(f"vocab_size={vocab_size} does not fit in uint32 token ids")


class TokenWriter:
    """Append token ids to ``path`` (.bin) in pieces; :meth:`commit` puts the file and its header in place.

    Use as a context manager: leaving the block by an exception (Ctrl-C included) removes the temporary file
    and leaves any earlier token file at ``path`` untouched.
    """

    def __init__(self, path: str | Path, vocab_size: int) -> None:
        self.path = Path(path)
        if self.path.suffix != ".bin":
            raise ValueError(f"token file path must end in .bin, got {self.path}")
        self.vocab_size = int(vocab_size)
        self.dtype_name = dtype_for_vocab(self.vocab_size)
        self.dtype = DTYPES[self.dtype_name]
        self.num_tokens = 0
        # The directories made here are removed again if the write is abandoned.
        self._made = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        self._file = open(self.tmp, "wb")  # noqa: SIM115 (closed by commit or abort)

    def write(self, tokens: np.ndarray) -> None:
        """Append 1-D integer ids, each in [0, vocab_size)."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(
                f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}"
            )
        if not tokens.size:
            return
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(
                f"token ids span [{lo}, {hi}] but vocab_size={self.vocab_size} "
                f"requires [0, {self.vocab_size - 1}]"
            )
        self._file.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self.num_tokens += int(tokens.size)

    def commit(self, tokenizer: dict[str, Any] | None = None, files: dict[Path, bytes] | None = None) -> dict:
        """Put the .bin in place, then ``files`` (e.g. the tokenizer), then the header; return the header."""
        header = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype_name,
            "vocab_size": self.vocab_size,
            "num_tokens": self.num_tokens,
            "tokenizer": tokenizer,
        }
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        # An old header must never describe the new .bin: remove it before the rename.
        header_path(self.path).unlink(missing_ok=True)
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        for path, data in (files or {}).items():
            atomic_write(path, data)
        atomic_write(header_path(self.path), (json.dumps(header, indent=2) + "\n").encode())
        return header

    def abort(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)
        for made in self._made:  # deepest first
            try:
                made.rmdir()
            except OSError:  # not empty (someone else wrote there) or already gone
                break

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None or not self._file.closed:
            self.abort()


def write_token_file(
    path: str | Path, tokens: np.ndarray, vocab_size: int, tokenizer: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write ``tokens`` (1-D ints in [0, vocab_size)) to ``path`` (.bin) and its header; return the header."""
    with TokenWriter(path, vocab_size) as writer:
        writer.write(tokens)
        return writer.commit(tokenizer)


def read_token_file(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """Memory-map token file ``path`` read-only; returns ``(tokens, header)``."""
    header = read_header(path)
    dtype = DTYPES[header["dtype"]]
    if header["num_tokens"] == 0:
        return np.zeros(0, dtype=dtype), header  # np.memmap refuses empty files
    tokens = np.memmap(path, dtype=dtype, mode="r", shape=(header["num_tokens"],))
    return tokens, header
