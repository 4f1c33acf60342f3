"""BatchStream (hpctrain.data.stream): DataLoader workers give exactly the synchronous batches, resume and
reshard are exact. CPU only; worker streams are shared (each start costs ~1-2 s). The user's dataset module:
tests/unit/data/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpctrain.data.datasets import TokenWindows
from hpctrain.data.sampler import GlobalBatchSampler
from hpctrain.data.stream import BatchStream
from hpctrain.data.tokenfile import read_token_file, write_token_file
from hpctrain.data.user import build_user_datasets

PER_PASS, GLOBAL, STEPS = 2, 8, 7


def _steps(
    dataset: Any,
    steps: int,
    *,
    workers: int = 0,
    rank: int = 0,
    size: int = 1,
    state: dict[str, Any] | None = None,
) -> tuple[list[list[Any]], dict[str, Any]]:
    sampler = GlobalBatchSampler(len(dataset), GLOBAL, seed=3)
    stream = BatchStream(dataset, sampler, rank, size, PER_PASS, num_workers=workers, seed=3)
    if state is not None:
        sampler.load_state_dict(state)  # after construction: the lazily started loader must honour it
    try:
        out = [stream.next_step() for _ in range(steps)]
        assert stream.data_wait_s >= 0.0
    finally:
        stream.close()
    return out, sampler.state_dict()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("name", ["Pairs", "Dicts"])
def test_workers_equal_sync_and_resume_is_exact(on_path: None, name: str) -> None:
    train, val = build_user_datasets(f"h2_user_data.{name}", {"n": 37, "dim": 3}, None)
    assert (len(train), len(val)) == (37, 5)
    sync, state = _steps(train, STEPS)
    assert state["consumed"] == STEPS * GLOBAL
    first = sync[0][0]
    assert isinstance(first, dict) if name == "Dicts" else isinstance(first, tuple) and len(first) == 2
    assert len(sync[0]) == GLOBAL // PER_PASS
    workers, state_w = _steps(train, STEPS, workers=2)
    assert state_w == state  # the sampler counts steps taken, not batches the workers read ahead
    assert _same(workers, sync)
    # Interrupted after 3 steps (workers had read ahead), resumed on a fresh sampler and stream with workers.
    _, at3 = _steps(train, 3, workers=2)
    assert at3["consumed"] == 3 * GLOBAL
    resumed, _ = _steps(train, STEPS - 3, workers=2, state=at3)
    assert _same(resumed, sync[3:])


def test_reshard_two_ranks_concatenate_to_one(on_path: None) -> None:
    train, _ = build_user_datasets("h2_user_data.Pairs", {"n": 37, "dim": 3}, None)
    one, _ = _steps(train, STEPS)
    halves = [_steps(train, STEPS, rank=r, size=2)[0] for r in (0, 1)]
    for step in range(STEPS):
        xs = torch.cat([b[0] for r in (0, 1) for b in halves[r][step]])
        ys = torch.cat([b[1] for r in (0, 1) for b in halves[r][step]])
        assert torch.equal(xs, torch.cat([b[0] for b in one[step]]))
        assert torch.equal(ys, torch.cat([b[1] for b in one[step]]))


def test_builtin_token_windows_through_workers_equal_get_batch(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    write_token_file(path, np.arange(2000, dtype=np.int64) % 251, 256)
    tokens, _ = read_token_file(path)
    assert isinstance(tokens, np.memmap)
    windows = TokenWindows(tokens, 16)
    torch.manual_seed(0)
    expected_draw = torch.rand(1)
    torch.manual_seed(0)
    workers, _ = _steps(windows, 3, workers=2)
    assert torch.equal(torch.rand(1), expected_draw)  # the loader left the training RNG stream alone
    direct = GlobalBatchSampler(len(windows), GLOBAL, seed=3)
    for step in workers:
        ix = direct.next_global_batch()
        expect = [windows.get_batch(ix[i : i + PER_PASS]) for i in range(0, GLOBAL, PER_PASS)]
        assert _same(step, expect)
