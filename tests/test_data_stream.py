"""BatchStream and user datasets: workers give exactly the synchronous batches, resume and reshard are exact,
and each wrong input is one line. CPU only; worker streams are shared (each start costs ~1-2 s)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpctrain.data.datasets import TokenWindows
from hpctrain.data.sampler import GlobalBatchSampler
from hpctrain.data.stream import BatchStream
from hpctrain.data.tokenfile import read_token_file, write_token_file
from hpctrain.data.user import ItemDataset, build_user_datasets
from hpctrain.errors import ConfigError

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

PER_PASS, GLOBAL, STEPS = 2, 8, 7


@pytest.fixture(scope="module")
def user_mod(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    (folder / "h2_user_data.py").write_text(textwrap.dedent(USER_MODULE))
    return folder


@pytest.fixture
def on_path(user_mod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Forkserver workers get this process's sys.path when they start and import the module by name.
    monkeypatch.syspath_prepend(str(user_mod))


def _steps(dataset: Any, steps: int, *, workers: int = 0, rank: int = 0, size: int = 1,
           state: dict[str, Any] | None = None) -> tuple[list[list[Any]], dict[str, Any]]:  # fmt: skip
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


def test_custom_collate_node_with_an_argument(on_path: None) -> None:
    node = {"_target_": "h2_user_data.stack_scaled", "scale": 10.0}
    train, _ = build_user_datasets("h2_user_data.Pairs", {"n": 9, "dim": 2}, node)
    x, y = train.get_batch(np.array([1, 2]))
    assert torch.equal(x, torch.tensor([[0.0, 10.0], [0.0, 20.0]])) and torch.equal(y, torch.tensor([1, 2]))


@pytest.mark.parametrize(
    ("target", "args", "expect"),
    [
        ("h2_no_such_module.Data", {}, "cannot be imported"),
        ("h2_user_data.Missing", {}, "has no attribute 'Missing'"),
        ("h2_user_data.Pairs", {"n": 3, "dim": {"_target_": "h2_user_data.Nope"}}, "data.dim._target_="),
        ("h2_user_data.nothing", {}, "has no items"),
        ("h2_user_data.number", {}, "returned int, not a map-style dataset"),
        ("h2_user_data.Stream", {}, "returned Stream, not a map-style dataset"),
        ("h2_user_data.Pairs", {"n": 0, "dim": 1}, "the train split has no items"),
    ],
)
def test_wrong_datasets_are_one_line(on_path: None, target: str, args: dict[str, Any], expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_user_datasets(target, args, None)
    assert expect in str(err.value) and "\n" not in str(err.value)


def test_users_exception_propagates_as_itself(on_path: None) -> None:
    with pytest.raises(KeyError, match="the user's own message") as err:
        build_user_datasets("h2_user_data.broken", {}, None)
    assert err.value.__context__ is None  # not chained to hydra's wrapper
    assert err.traceback[-1].name == "broken"  # their frame is where it points


def test_item_of_the_wrong_type_is_one_line(on_path: None) -> None:
    train, _ = build_user_datasets("h2_user_data.Strings", {"n": 4, "dim": 1}, None)
    with pytest.raises(ValueError, match=r"item 2 is a str.*\(input, target\) pair or a dict") as err:
        train.get_batch([2])
    assert "\n" not in str(err.value)
    assert isinstance(train, ItemDataset)
