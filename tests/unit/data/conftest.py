"""A user's dataset module (``h2_user_data``), importable by name, as DataLoader workers import it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

USER_MODULE = '''
import torch
from torch.utils.data import IterableDataset


class Pairs:
    """Sample i: a small tensor and an int label, a pure function of i."""

    def __init__(self, n, dim, split):
        self.n, self.dim = (n if split == "train" else 5), dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.arange(self.dim, dtype=torch.float32) * i, i % 3


class Dicts(Pairs):
    def __getitem__(self, i):
        return {"input_ids": torch.full((4,), i), "labels": torch.full((4,), i + 1)}


class Strings(Pairs):
    def __getitem__(self, i):
        return "text"


class Stream(IterableDataset):
    def __init__(self, split):
        pass

    def __iter__(self):
        return iter(())


def nothing(split):
    return []


def number(split):
    return 3


def broken(split):
    raise KeyError("the user's own message")


def stack_scaled(items, scale):
    xs, ys = zip(*items)
    return torch.stack(xs) * scale, torch.tensor(ys)
'''


@pytest.fixture(scope="module")
def user_mod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    (folder / "h2_user_data.py").write_text(textwrap.dedent(USER_MODULE))
    return folder


@pytest.fixture
def on_path(user_mod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Forkserver workers get this process's sys.path when they start and import the module by name.
    monkeypatch.syspath_prepend(str(user_mod))
