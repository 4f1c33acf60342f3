"""The global batch sampler (hpctrain.data.sampler): every epoch once, exact resume, the same global order on
another data-parallel size, each rank's shard and micro-batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hpctrain.data import GlobalBatchSampler, shard_for_rank, split_micro_batches


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
