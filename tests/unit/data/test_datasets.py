"""The built-in datasets (hpctrain.data.datasets) and build_datasets: shapes, determinism, splits, and the
model/data mismatches refused in one line."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.config.schema import DataConfig
from hpctrain.data import build_datasets
from hpctrain.data.catalog import fixed_image_shape, fixed_vocab
from hpctrain.data.datasets import Digits, TokenWindows, stdlib_text
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.synthetic import SyntheticImages, SyntheticTokens

GPT = GPTConfig(seq_len=16, vocab_size=64)
VIT = ViTConfig()


def test_synthetic_tokens_shapes_determinism_and_shift() -> None:
    ds = SyntheticTokens(100, seq_len=16, vocab_size=64, seed=3)
    x, y = ds.get_batch([5, 7, 5])
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x[0], x[2])  # sample 5 is the same wherever it appears in a batch
    x2, _ = SyntheticTokens(100, seq_len=16, vocab_size=64, seed=3).get_batch([7])
    assert torch.equal(x2[0], x[1])
    x3, _ = SyntheticTokens(100, seq_len=16, vocab_size=64, seed=4).get_batch([7])
    assert not torch.equal(x3[0], x[1])
    assert int(x.min()) >= 0 and int(x.max()) < 64
    with pytest.raises(IndexError, match="100 samples"):
        ds.get_batch([100])


def test_synthetic_tokens_are_learnable() -> None:
    # Successor entropy is at most ln(4) (four successors per token), far below uniform ln(vocab).
    vocab = 64
    x, y = SyntheticTokens(256, seq_len=64, vocab_size=vocab, seed=0).get_batch(range(256))
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (x.numpy().ravel(), y.numpy().ravel()), 1)
    p = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        row_entropy = -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
    weights = counts.sum(axis=1) / counts.sum()
    assert float(weights @ row_entropy) < math.log(4) + 0.01 < math.log(vocab) / 2


def test_synthetic_images_class_conditional() -> None:
    ds = SyntheticImages(200, C=3, H=4, W=4, num_classes=5, seed=1)
    x, y = ds.get_batch(range(200))
    assert x.shape == (200, 3, 4, 4) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert set(y.tolist()) == set(range(5))
    # Nearest template recovers the label for most samples: the classes are separable.
    templates = torch.from_numpy(ds.templates).flatten(1)
    nearest = torch.cdist(x.flatten(1), templates).argmin(dim=1)
    assert (nearest == y).float().mean() > 0.9
    x2, y2 = SyntheticImages(200, C=3, H=4, W=4, num_classes=5, seed=1).get_batch([17])
    assert torch.equal(x2[0], x[17]) and y2[0] == y[17]


def test_digits() -> None:
    ds = Digits()
    assert len(ds) == 1797
    x, y = ds.get_batch(range(len(ds)))
    assert x.shape == (1797, 1, 8, 8) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    assert abs(x.mean().item()) < 1e-4 and x.std().item() == pytest.approx(1.0, abs=1e-3)
    assert fixed_image_shape("digits") == (1, 8, 8, 10)


def test_token_windows() -> None:
    tokens = np.arange(23, dtype=np.uint16)
    ds = TokenWindows(tokens, seq_len=5)
    assert len(ds) == (23 - 1) // 5 == 4
    x, y = ds.get_batch([0, 3])
    assert x.tolist() == [[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]]
    assert y.tolist() == [[1, 2, 3, 4, 5], [16, 17, 18, 19, 20]]
    assert x.dtype == torch.int64
    with pytest.raises(IndexError):
        ds.get_batch([4])


def test_text_corpus_deterministic_and_byte_level() -> None:
    a = stdlib_text(200_000)
    b = stdlib_text(200_000)
    assert a.size == 200_000 and np.array_equal(a, b)
    assert int(a.max()) < 256 == fixed_vocab("text")
    assert b"import " in a.tobytes()
    data = DataConfig(name="text", max_bytes=200_000, val_fraction=0.1)
    train, val = build_datasets(data, replace(GPT, vocab_size=256), seed=0)
    n = (200_000 - 1) // GPT.seq_len
    assert len(train) + len(val) == n and len(val) == round(0.1 * n)
    x, _ = val.get_batch([0])
    # Val starts right after train: its first window is window len(train) of the corpus.
    assert x[0].tolist() == a[len(train) * 16 : len(train) * 16 + 16].tolist()


def test_build_datasets_synthetic_split_disjoint() -> None:
    data = DataConfig(name="synthetic", num_samples=40, val_fraction=0.25)
    train, val = build_datasets(data, GPT, seed=1)
    assert (len(train), len(val)) == (30, 10)
    tx, _ = train.get_batch(range(30))
    vx, _ = val.get_batch(range(10))
    assert tx.shape == (30, 16) and int(tx.max()) < 64
    assert not any(torch.equal(v, t) for v in vx for t in tx)
    # Same seed, same split.
    vx2, _ = build_datasets(data, GPT, seed=1)[1].get_batch(range(10))
    assert torch.equal(vx, vx2)
    # At least one sample on each side, even for extreme fractions.
    tiny_train, tiny_val = build_datasets(replace(data, num_samples=2, val_fraction=0.01), GPT, seed=1)
    assert (len(tiny_train), len(tiny_val)) == (1, 1)
    vit_cfg = replace(VIT, image_size=12, patch_size=4, in_channels=3, num_classes=7)
    images, labels = build_datasets(data, vit_cfg, seed=1)[0].get_batch([0, 1])
    assert images.shape == (2, 3, 12, 12) and int(labels.max()) < 7


def test_build_datasets_digits_and_mismatches() -> None:
    train, val = build_datasets(DataConfig(name="digits"), VIT, seed=0)
    assert len(train) + len(val) == 1797 and len(val) == round(0.05 * 1797)
    with pytest.raises(ValueError, match=r"model\.image_size=224: data=digits gives 1×8×8 images"):
        build_datasets(DataConfig(name="digits"), replace(VIT, image_size=224, patch_size=16), seed=0)
    with pytest.raises(ValueError, match=r"data=text: gives tokens but model ViT takes images"):
        build_datasets(DataConfig(name="text"), VIT, seed=0)
    with pytest.raises(ValueError, match=r"model\.vocab_size=64: data=text has a vocabulary of 256"):
        build_datasets(DataConfig(name="text"), replace(GPT, vocab_size=64), seed=0)


def test_token_path_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data\.path=null: required for data=tokens"):
        build_datasets(DataConfig(name="tokens"), GPT, seed=0)
    absent = DataConfig(name="tokens", path=str(tmp_path / "absent.bin"))
    with pytest.raises(ValueError, match=r"no token file there"):
        build_datasets(absent, GPT, seed=0)
