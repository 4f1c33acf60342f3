"""Map-style datasets that build whole batches at once.

Every dataset has ``__len__`` and ``get_batch(indices) -> (inputs, targets)`` returning CPU tensors:
token datasets give int64 ``[B, seq_len]`` inputs and the same shifted by one as targets; image datasets
give float32 ``[B, C, H, W]`` and int64 ``[B]`` labels. Building a batch in one vectorised call (instead of
a DataLoader collating B samples) keeps the data path cheap without worker processes. Sample i is always a
pure function of the dataset's arguments and i, so any rank can build any sample and resumes are exact.
"""

from __future__ import annotations

import mmap
import os
import sysconfig
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from hpctrain.data import catalog
from hpctrain.data.catalog import check_builtin_data, check_feeds
from hpctrain.data.tokenfile import read_token_file
from hpctrain.errors import ConfigError


class Dataset(Protocol):
    def __len__(self) -> int: ...

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]: ...


def _as_indices(indices: Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"sample indices span [{idx.min()}, {idx.max()}] but the dataset has {n} samples")
    return idx


class Digits:
    """scikit-learn's 1797 handwritten digits (bundled with the package, no download): 1×8×8, 10 classes.

    Pixels (0..16) are scaled to [0, 1] and then standardised with the whole set's mean and std.
    """

    def __init__(self) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = digits.data.astype(np.float32) / 16.0
        x = (x - x.mean()) / x.std()
        c, h, w, self.num_classes = catalog.DIGITS_SHAPE
        self.images = np.ascontiguousarray(x.reshape(-1, c, h, w))
        self.labels = digits.target.astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = _as_indices(indices, len(self))
        return torch.from_numpy(self.images[idx]), torch.from_numpy(self.labels[idx])


class _MappedFile(NamedTuple):
    """Where a read-only np.memmap's data lies: enough to map it again in another process."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


class TokenWindows:
    """Non-overlapping windows over a 1-D token stream: sample i is ``tokens[i·T : i·T + T + 1]``.

    Consecutive windows share their boundary token (target of one, input of the next), so every token is
    predicted once. ``len = (len(tokens) - 1) // T``; a trailing partial window is dropped.
    """

    def __init__(self, tokens: Any, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len={seq_len} must be at least 1")
        self.tokens, self.seq_len = tokens, seq_len
        self.num_samples = max(0, (len(tokens) - 1) // seq_len)
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.num_samples

    def __getstate__(self) -> dict[str, Any]:
        # A DataLoader worker started by forkserver/spawn receives the dataset pickled. np.memmap pickles
        # as a full in-memory copy (100 MB for 50M uint16 tokens, per worker); send the file's name and
        # layout instead, and the worker maps the same pages of the shared page cache.
        state = dict(self.__dict__)
        tokens = self.tokens
        if isinstance(tokens, np.memmap) and tokens.filename and isinstance(tokens.base, mmap.mmap):
            state["tokens"] = _MappedFile(tokens.filename, tokens.dtype.str, tokens.shape, tokens.offset)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["tokens"], _MappedFile):
            f = state["tokens"]
            state["tokens"] = np.memmap(f.path, dtype=f.dtype, mode="r", shape=f.shape, offset=f.offset)
        self.__dict__.update(state)

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = _as_indices(indices, self.num_samples)
        # One fancy-indexing gather; on a memmap this touches only the pages of the requested windows.
        windows = np.asarray(self.tokens[idx[:, None] * self.seq_len + self._offsets], dtype=np.int64)
        seqs = torch.from_numpy(windows)
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


class Slice:
    """Samples ``[start, stop)`` of another dataset, renumbered from 0 (used for the train/val split)."""

    def __init__(self, base: Dataset, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= len(base):
            raise ValueError(f"slice [{start}, {stop}) out of range for a dataset of {len(base)} samples")
        self.base, self.start, self.stop = base, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.get_batch(_as_indices(indices, len(self)) + self.start)


def _skip_dir(name: str) -> bool:
    return name in ("site-packages", "dist-packages", "__pycache__", "test", "tests") or name.startswith(".")


def stdlib_text(max_bytes: int) -> np.ndarray:
    """The Python standard library's ``.py`` sources as bytes (uint8), at most ``max_bytes``.

    Walks ``sysconfig.get_paths()["stdlib"]`` in sorted order, skipping installed packages and test suites,
    so the corpus is the same on every rank and every run with the same Python.
    """
    root = sysconfig.get_paths()["stdlib"]
    chunks: list[bytes] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skip_dir(d))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read(max_bytes - total)
            chunks.append(data)
            total += len(data)
            if total >= max_bytes:
                return np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if total == 0:
        raise RuntimeError(f"no .py sources found under the standard library at {root}")
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


def _full_dataset(data: Any, spec: Any, seed: int) -> Dataset:
    """The built-in dataset ``data.name`` shaped for the model's declared input (``spec``, a ModelSpec)."""
    check_builtin_data(data)  # raises ConfigError (a ValueError) naming the key and what fits
    check_feeds(data, spec)
    if data.name == "synthetic":  # shaped by the model: its spec makes it
        return spec.synthetic_dataset(data.num_samples, seed)  # type: ignore[no-any-return]
    if data.name == "digits":
        return Digits()
    # Token windows are cut at data.seq_len, else at the model's declared length (checked by check_feeds).
    seq_len = data.seq_len or spec.context_length
    if seq_len is None:
        raise ConfigError(
            "data",
            data.name,
            f"cuts windows of the model's seq_len; model {spec.name} declares none",
            valid="data.seq_len=N, a model config with n_positions, or a dataset of your own: data._target_",
        )
    if data.name == "text":
        return TokenWindows(stdlib_text(data.max_bytes), seq_len)
    if data.name == "tokens":
        tokens, _ = read_token_file(data.path)
        return TokenWindows(tokens, seq_len)
    raise ValueError(f"unknown data.name={data.name!r}")


def build_datasets(data: Any, spec: Any, seed: int) -> tuple[Dataset, Dataset]:
    """``(train, val)`` for the built-in ``data`` (a DataConfig) shaped for the model's ``spec``.

    The last ``val_fraction`` of the samples (at least one) is the validation set, the rest (at least one)
    is training: deterministic and disjoint. Synthetic data depends on ``seed``; the others do not.
    """
    full = _full_dataset(data, spec, seed)
    n = len(full)
    if n < 2:
        detail = ""
        if isinstance(full, TokenWindows):
            detail = f" ({len(full.tokens)} tokens in windows of seq_len={full.seq_len} + 1)"
        raise ValueError(
            f"data={data.name} gives {n} sample(s){detail}; need at least 2 (one train, one val)"
        )
    n_val = min(n - 1, max(1, round(n * data.val_fraction)))
    return Slice(full, 0, n - n_val), Slice(full, n - n_val, n)
