"""Token files from text or .npy arrays (what ``hpctrain prepare`` runs): write a token file.

Text mode tokenizes bytes (vocab 256) of the given files and directories (recursively, in sorted path
order, skipping hidden entries); ``--from-npy`` concatenates pre-tokenized 1-D integer ``.npy`` arrays.
The output is ``PATH.bin`` plus its ``PATH.json`` header (see ``hpctrain.data.tokenfile``), each written
under a temporary name and renamed into place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.data.tokenfile import header_path, write_token_file

BYTE_VOCAB = 256


def _text_files(inputs: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                raise ValueError(f"directory {path} contains no files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"input {path} does not exist")
    return files


def _load_npy(inputs: list[Path]) -> np.ndarray:
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
        arrays.append(np.asarray(arr))
    return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]


def _check_not_an_input(out: Path, inputs: list[Path]) -> None:
    """The output (PATH.bin and its PATH.json header) must not overwrite an input, nor land inside an input
    directory, where the next run would read it back as text."""
    written = {out.resolve(), header_path(out).resolve()}
    for path in inputs:
        resolved = path.resolve()
        if resolved in written or (path.is_dir() and any(w.is_relative_to(resolved) for w in written)):
            raise ValueError(
                f"--out={out} would overwrite or land inside the input {path} "
                "(valid: a path outside every input file and directory)"
            )


def prepare_tokens(inputs: list[Path], out: Path, from_npy: bool, vocab_size: int | None) -> dict[str, Any]:
    """Write the token file ``out`` (and its header) from text files or directories, or from .npy token
    arrays; return its header. A bad input is a ValueError (or an OSError) with one line."""
    if out.suffix != ".bin":
        raise ValueError(f"--out must end in .bin (its header goes next to it as .json), got {out}")
    _check_not_an_input(out, inputs)
    if from_npy:
        tokens = _load_npy(inputs)
        if tokens.size and int(tokens.min()) < 0:
            raise ValueError(f"token ids must be non-negative; found {int(tokens.min())}")
        max_id = int(tokens.max()) if tokens.size else -1
        vocab = vocab_size if vocab_size is not None else max_id + 1
    else:
        files = _text_files(inputs)
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in files), dtype=np.uint8)
        max_id = int(tokens.max()) if tokens.size else -1
        vocab = vocab_size if vocab_size is not None else BYTE_VOCAB
    if tokens.size < 2:
        raise ValueError(f"inputs hold {tokens.size} token(s); a training window needs at least 2")
    if vocab <= max_id:
        raise ValueError(f"--vocab-size={vocab} is too small for the largest token id {max_id}")
    return write_token_file(out, tokens, vocab)
