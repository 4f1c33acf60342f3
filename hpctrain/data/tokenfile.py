"""Token files: ``<name>.bin`` (raw little-endian token ids) plus a ``<name>.json`` header.

The header is ``{"format": "hpctrain-tokens", "version": 1, "dtype": "uint16", "vocab_size": V,
"num_tokens": N}``; ids are uint16 when V ≤ 65536, else uint32. Files are read through a read-only
``np.memmap`` so every rank shares the page cache instead of holding its own copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.config.catalog import TOKEN_FORMAT as FORMAT
from hpctrain.config.catalog import TOKEN_VERSION as VERSION
from hpctrain.config.catalog import read_token_header as read_header
from hpctrain.rundir.files import atomic_write

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def header_path(path: str | Path) -> Path:
    return Path(path).with_suffix(".json")


def dtype_for_vocab(vocab_size: int) -> str:
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be at least 1")
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise ValueError(f"vocab_size={vocab_size} does not fit in uint32 token ids")


def write_token_file(path: str | Path, tokens: np.ndarray, vocab_size: int) -> dict[str, Any]:
    """Write ``tokens`` (1-D ints in [0, vocab_size)) to ``path`` (.bin) and its header; return the header."""
    path = Path(path)
    if path.suffix != ".bin":
        raise ValueError(f"token file path must end in .bin, got {path}")
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(
            f"token ids span [{int(tokens.min())}, {int(tokens.max())}] but vocab_size={vocab_size} "
            f"requires [0, {vocab_size - 1}]"
        )
    dtype = dtype_for_vocab(vocab_size)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "vocab_size": int(vocab_size),
        "num_tokens": int(tokens.size),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    # Data first, header last: a header on disk always describes a complete .bin (or the size check fails).
    atomic_write(path, lambda f: f.write(tokens.astype(DTYPES[dtype], copy=False).tobytes()))
    atomic_write(header_path(path), lambda f: f.write((json.dumps(header, indent=2) + "\n").encode()))
    return header


def read_token_file(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """Memory-map token file ``path`` read-only; returns ``(tokens, header)``."""
    header = read_header(path)
    dtype = DTYPES[header["dtype"]]
    if header["num_tokens"] == 0:
        return np.zeros(0, dtype=dtype), header  # np.memmap refuses empty files
    tokens = np.memmap(path, dtype=dtype, mode="r", shape=(header["num_tokens"],))
    return tokens, header
