"""The sources of ``hpctrain prepare``, read in bounded pieces: text files, saved datasets, .npy arrays.

A text input is a file or a directory (its files, recursively, in sorted path order, skipping hidden
entries). A directory written by ``datasets``' ``Dataset.save_to_disk`` (or ``DatasetDict``'s, whose
``train`` split is used) is read row by row from its text column; ``datasets`` is imported only then. Each
file and each row is read in pieces of at most about ``chunk_bytes``, cut at a line start where there is
one and never inside a UTF-8 character, so a corpus larger than memory streams through.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hpctrain.errors import ConfigError

CHUNK_BYTES = 1 << 16  # one piece: 64 KiB of text
_SPACE = b" \t\n\r\x0b\x0c"
_SCAN = 1 << 14  # how far back from a block's end a line start is looked for
BATCH_BYTES = 1 << 18  # one task for a worker: pieces adding up to about 256 KiB
_DATASET_MARKERS = ("dataset_info.json", "state.json")


class Source(NamedTuple):
    kind: str  # "file" or "dataset"
    path: Path


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and (
        all((path / m).is_file() for m in _DATASET_MARKERS) or (path / "dataset_dict.json").is_file()
    )


def text_sources(inputs: list[Path]) -> list[Source]:
    """The files and saved datasets of ``inputs``; a ValueError (one line) for a missing or empty input."""
    sources: list[Source] = []
    for path in inputs:
        if is_saved_dataset(path):
            sources.append(Source("dataset", path))
        elif path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                raise ValueError(f"directory {path} contains no files")
            sources.extend(Source("file", p) for p in found)
        elif path.is_file():
            sources.append(Source("file", path))
        else:
            raise ValueError(f"input {path} does not exist")
    files = [s.path for s in sources if s.kind == "file"]
    if len(files) == len(sources) and sum(p.stat().st_size for p in files) == 0:
        raise ValueError(f"the corpus is empty: {', '.join(map(str, inputs))} hold no bytes")
    return sources


def open_dataset(path: Path, text_column: str) -> Any:
    """The ``datasets.Dataset`` saved at ``path`` (a DatasetDict's ``train`` split), text column checked."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{path} is a saved `datasets` dataset; reading it needs `pip install datasets`"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises many kinds for a damaged folder
        raise ValueError(f"{path}: cannot load the saved dataset ({str(err).splitlines()[0]})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise ValueError(f"{path} holds the splits {sorted(ds)}; expected a 'train' split or only one")
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    if text_column not in ds.column_names:
        raise ConfigError(
            "--text-column", text_column, f"is not a column of {path}", valid=", ".join(ds.column_names)
        )
    return ds.select_columns([text_column])


def _cut(data: bytes) -> int:
    """Where to end a piece of ``data``: at the start of its last line that starts with no white space and
    follows a line that ends with none (so a byte-level BPE tokenizes across the cut as it would without it),
    else at its last line start, else before a UTF-8 character it would cut."""
    end = len(data)
    for clean in (True, False):
        at, low = end, max(0, end - _SCAN)
        while (at := data.rfind(b"\n", low, at)) >= 0:
            if at + 1 < end and data[at + 1] not in _SPACE and not (clean and at and data[at - 1] in _SPACE):
                return at + 1
    cut = data.rfind(b"\n") + 1
    if cut:
        return cut
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0xC0:  # a lead byte: is its character complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return end if back >= need else end - back
        if byte & 0xC0 != 0x80:  # ASCII: nothing cut
            return end
    return end


def _split(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """Pieces of one document (a file or a row) given in blocks, each cut by :func:`_cut`."""
    carry = b""
    for block in blocks:
        data = carry + block
        cut = _cut(data)
        if cut:
            yield data[:cut]
        carry = data[cut:]
    if carry:
        yield carry


def _file_blocks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            yield block


def _dataset_blocks(path: Path, text_column: str, chunk_bytes: int) -> Iterator[Iterator[bytes]]:
    ds = open_dataset(path, text_column)
    for batch in ds.iter(batch_size=256):
        for text in batch[text_column]:
            if text is None:
                continue
            if not isinstance(text, str):
                raise ValueError(f"{path}: column {text_column!r} holds {type(text).__name__}, not text")
            data = text.encode("utf-8")
            yield (data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes))


def pieces(
    sources: list[Source], text_column: str, chunk_bytes: int = CHUNK_BYTES, cut: bool = True
) -> Iterator[bytes]:
    """Every document of ``sources`` in order, as pieces of at most about ``2 × chunk_bytes`` bytes, cut by
    :func:`_cut` (``cut=False``: as read, for byte ids, which do not depend on where a piece ends)."""
    split = _split if cut else iter
    for source in sources:
        if source.kind == "file":
            yield from split(_file_blocks(source.path, chunk_bytes))
        else:
            for blocks in _dataset_blocks(source.path, text_column, chunk_bytes):
                yield from split(blocks)


def batches(parts: Iterator[bytes], batch_bytes: int = BATCH_BYTES) -> Iterator[list[bytes]]:
    """Consecutive pieces grouped into lists of about ``batch_bytes`` (one task for a worker)."""
    batch: list[bytes] = []
    size = 0
    for part in parts:
        batch.append(part)
        size += len(part)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class NpyArray(NamedTuple):
    path: Path
    dtype: np.dtype
    size: int
    offset: int


def npy_arrays(inputs: list[Path]) -> list[NpyArray]:
    """Where the ids of each 1-D integer ``.npy`` input lie (nothing is read into memory yet)."""
    arrays = []
    for path in inputs:
        if not path.is_file():
            raise ValueError(f"input {path} does not exist or is not a file")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{path} is not a readable .npy array: {e}") from e
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"{path} holds shape {arr.shape} dtype {arr.dtype}; expected a 1-D integer array"
            )
        offset = arr.offset if isinstance(arr, np.memmap) else 0
        arrays.append(NpyArray(path, arr.dtype, int(arr.size), offset))
        del arr
    return arrays


def npy_blocks(arrays: list[NpyArray], count: int = 1 << 20) -> Iterator[np.ndarray]:
    """The ids of ``arrays`` in order, ``count`` at a time, read with plain reads (no mapping kept)."""
    for a in arrays:
        with open(a.path, "rb") as f:
            f.seek(a.offset)
            left = a.size
            while left:
                block = np.fromfile(f, dtype=a.dtype, count=min(count, left))
                if not block.size:
                    raise ValueError(f"{a.path} ends before its {a.size} ids")
                left -= block.size
                yield block
