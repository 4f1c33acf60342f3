"""Map-style datasets called with ``split`` ("train" / "val"): the contract of hpctrain's ``data._target_``.

Item i is a pure function of the arguments and i (nothing random at access time), so a resumed run sees
exactly the samples it would have seen. Both read local data only: nothing is downloaded.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset


class Digits8(Dataset):
    """scikit-learn's bundled 8×8 handwritten digits: items ``(float32 [1, 8, 8], int64 label)``."""

    def __init__(self, split: str, val_fraction: float = 0.1) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
        x = (x - x.mean()) / x.std()
        n_val = int(len(x) * val_fraction)
        rows = slice(0, len(x) - n_val) if split == "train" else slice(len(x) - n_val, len(x))
        self.images = torch.from_numpy(np.ascontiguousarray(x[rows]))
        self.labels = torch.from_numpy(digits.target[rows].astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]


class ByteText(Dataset):
    """Byte-level windows of local text: items ``{"input_ids": int64 [seq_len], "labels": int64 [seq_len]}``.

    ``shift=True``: labels are the next bytes (for hpctrain's default cross-entropy); ``shift=False``:
    labels equal input_ids (for ``loss=model`` with a transformers model, which shifts them itself). The
    text is the ``*.py`` files under ``root`` (default: Python's standard library), the last 5% of the
    windows the validation split.
    """

    def __init__(
        self,
        split: str,
        seq_len: int = 64,
        max_bytes: int = 400_000,
        root: str | None = None,
        shift: bool = True,
    ) -> None:
        folder = Path(root) if root else Path(sysconfig.get_paths()["stdlib"])
        text = bytearray()
        for path in sorted(folder.glob("*.py")):
            text += path.read_bytes()[: max_bytes - len(text)]
            if len(text) >= max_bytes:
                break
        self.tokens = torch.frombuffer(text, dtype=torch.uint8).long()
        windows = (len(self.tokens) - 1) // seq_len
        n_val = max(1, windows // 20)
        self.starts = range(windows - n_val) if split == "train" else range(windows - n_val, windows)
        self.seq_len, self.shift = seq_len, shift

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = self.starts[i] * self.seq_len
        ids = self.tokens[start : start + self.seq_len]
        labels = self.tokens[start + 1 : start + self.seq_len + 1] if self.shift else ids.clone()
        return {"input_ids": ids, "labels": labels}
