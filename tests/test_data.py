from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.cli import main as hpctrain_main
from hpctrain.config.schema import DataConfig
from hpctrain.data import GlobalBatchSampler, build_datasets, shard_for_rank, split_micro_batches
from hpctrain.data.catalog import fixed_image_shape, fixed_vocab
from hpctrain.data.datasets import Digits, TokenWindows, stdlib_text
from hpctrain.data.tokenfile import read_header, read_token_file, write_token_file
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.synthetic import SyntheticImages, SyntheticTokens


def run_prepare(name: str, argv: list[str]) -> int:
    """``hpctrain prepare ARGV`` in this process, through the CLI's entry point."""
    return hpctrain_main([name, *argv])


GPT = GPTConfig(seq_len=16, vocab_size=64)
VIT = ViTConfig()

# ---------------------------------------------------------------- datasets


def prepare_main(argv: list[str]) -> int:
    return run_prepare("prepare", argv)


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


# ---------------------------------------------------------------- sampler


def _drain(sampler: GlobalBatchSampler, steps: int) -> list[int]:
    return [int(i) for _ in range(steps) for i in sampler.next_global_batch()]


def test_sampler_covers_each_epoch_exactly_once_and_crosses_boundaries() -> None:
    n, g = 10, 4
    sampler = GlobalBatchSampler(n, g, seed=0)
    stream = _drain(sampler, 5)  # 20 samples = exactly two epochs, batches straddle the boundaries
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # each epoch reshuffled
    assert sampler.consumed == 20 and sampler.epoch == 2
    # A batch larger than the dataset spans several epochs.
    big = GlobalBatchSampler(3, 7, seed=0).next_global_batch()
    assert big.dtype == np.int64 and len(big) == 7
    assert sorted(big[:3].tolist()) == sorted(big[3:6].tolist()) == [0, 1, 2]


def test_sampler_resume_is_identical() -> None:
    a = GlobalBatchSampler(13, 4, seed=5)
    _drain(a, 3)
    state = a.state_dict()
    expected = _drain(a, 6)
    b = GlobalBatchSampler(13, 4, seed=5)
    b.load_state_dict(json.loads(json.dumps(state)))  # survives a round trip through plain data
    assert _drain(b, 6) == expected


def test_sampler_resume_on_different_dp_size() -> None:
    n, g = 37, 8
    reference = GlobalBatchSampler(n, g, seed=2)
    full = [reference.next_global_batch() for _ in range(12)]
    # First 5 steps on 2 ranks, then resume on 4 ranks: the global order must not change.
    before = GlobalBatchSampler(n, g, seed=2)
    seen: list[np.ndarray] = []
    for _ in range(5):
        batch = before.next_global_batch()
        seen.append(np.concatenate([shard_for_rank(batch, r, 2) for r in range(2)]))
    after = GlobalBatchSampler(n, g, seed=2)
    after.load_state_dict(before.state_dict())
    for _ in range(7):
        batch = after.next_global_batch()
        shards = [shard_for_rank(batch, r, 4) for r in range(4)]
        assert all(len(s) == 2 for s in shards)
        seen.append(np.concatenate(shards))
    for got, want in zip(seen, full, strict=True):
        np.testing.assert_array_equal(got, want)


def test_sampler_rejects_foreign_state() -> None:
    state = GlobalBatchSampler(100, 4, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"100 samples.*has 99"):
        GlobalBatchSampler(99, 4, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"seed=1.*seed=2"):
        GlobalBatchSampler(100, 4, seed=2).load_state_dict(state)


def test_shard_and_micro_batches() -> None:
    batch = np.arange(12)
    assert shard_for_rank(batch, 1, 3).tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match=r"12 samples.*dp_size=5"):
        shard_for_rank(batch, 0, 5)
    with pytest.raises(ValueError, match="dp_rank=3"):
        shard_for_rank(batch, 3, 3)
    micro = split_micro_batches(batch[:8], 2)
    assert [m.tolist() for m in micro] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match=r"8 samples.*micro-batches of 3"):
        split_micro_batches(batch[:8], 3)


# ---------------------------------------------------------------- token files


def test_token_file_round_trip(tmp_path: Path) -> None:
    tokens = np.array([0, 5, 65535, 7, 1], dtype=np.int64)
    header = write_token_file(tmp_path / "t.bin", tokens, vocab_size=65536)
    assert header == {
        "format": "hpctrain-tokens",
        "version": 2,
        "dtype": "uint16",
        "vocab_size": 65536,
        "num_tokens": 5,
        "tokenizer": None,
    }
    assert (tmp_path / "t.bin").stat().st_size == 10
    mm, hdr = read_token_file(tmp_path / "t.bin")
    assert hdr == header and mm.tolist() == tokens.tolist()
    assert not mm.flags.writeable
    big = write_token_file(tmp_path / "u.bin", np.array([70000, 1]), vocab_size=70001)
    assert big["dtype"] == "uint32" and read_token_file(tmp_path / "u.bin")[0].tolist() == [70000, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin", "t.json", "u.bin", "u.json"]  # no temps
    with pytest.raises(ValueError, match="vocab_size=10"):
        write_token_file(tmp_path / "v.bin", np.array([3, 12]), vocab_size=10)


def test_token_file_size_mismatch(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t.bin", np.arange(10), vocab_size=10)
    with open(tmp_path / "t.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ValueError, match=r"21 bytes.*num_tokens=10 × 2 bytes \(uint16\) = 20 bytes"):
        read_header(tmp_path / "t.bin")
    (tmp_path / "t.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not an hpctrain-tokens header"):
        read_header(tmp_path / "t.bin")


def test_prepare_text_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "b.txt").write_bytes(b"world")
    (src / "a.txt").write_bytes(b"hello ")
    (src / "sub" / "c.txt").write_bytes("é!".encode())
    (src / ".hidden").write_bytes(b"SKIPPED")
    out = tmp_path / "out" / "corpus.bin"
    assert prepare_main([str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "14 tokens" in printed and "vocab 256" in printed and str(out) in printed
    tokens, header = read_token_file(out)
    assert bytes(np.asarray(tokens, dtype=np.uint8)) == "hello worldé!".encode()
    assert header["vocab_size"] == 256 and header["dtype"] == "uint16"
    # The file feeds data=tokens directly.
    data = DataConfig(name="tokens", path=str(out), val_fraction=0.3)
    train, val = build_datasets(data, GPTConfig(seq_len=2), seed=0)
    assert len(train) + len(val) == (14 - 1) // 2
    x, y = train.get_batch([0])
    assert x.tolist() == [[ord("h"), ord("e")]] and y.tolist() == [[ord("e"), ord("l")]]


def test_prepare_npy_cli_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arr = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int32)
    np.save(tmp_path / "a.npy", arr)
    out = tmp_path / "a.bin"
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy"]) == 0
    tokens, header = read_token_file(out)
    assert tokens.tolist() == arr.tolist() and header["vocab_size"] == 10
    assert (
        prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy", "--vocab-size", "70000"]) == 0
    )
    assert read_header(out)["dtype"] == "uint32"
    capsys.readouterr()
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy", "--vocab-size", "5"]) == 1
    assert "--vocab-size=5 is too small for the largest token id 9" in capsys.readouterr().err
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(tmp_path / "a.dat"), "--from-npy"]) == 1
    assert "must end in .bin" in capsys.readouterr().err
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype=np.int64))
    assert prepare_main([str(tmp_path / "m.npy"), "--out", str(out), "--from-npy"]) == 1
    assert "expected a 1-D integer array" in capsys.readouterr().err
    assert prepare_main([str(tmp_path / "missing"), "--out", str(out)]) == 1
    assert prepare_main([]) == 2  # argparse usage error
    # A vocabulary larger than the model's is caught when building datasets.
    with pytest.raises(ValueError, match=r"model\.vocab_size=8: data=tokens has a vocabulary of 70000"):
        build_datasets(DataConfig(name="tokens", path=str(tmp_path / "a.bin")), GPTConfig(vocab_size=8), 0)
