"""Asynchronous checkpoints (hpctrain.checkpoint.manager): staged before ``save`` returns, committed at the
next save or at ``wait()``. (The staging buffers alone: tests/unit/checkpoint/test_staging.py.)

Two DDP ranks on gloo (torch.multiprocessing): the weights keep changing (and DDP keeps all-reducing on the
default group) while the shards are written in the background; what is loaded afterwards is bitwise the
state at the step that was saved.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import ModelOptimizerState, RNGState, TrainState
from hpctrain.rundir import checkpoints as layout
from hpctrain.verify.local_group import start_ranks

WORLD_SIZE = 2


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, rank: int) -> None:
    for _ in range(steps):
        x = torch.randn(8, 16) + rank
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def snapshot(state: ModelOptimizerState) -> dict[str, torch.Tensor]:
    """Every tensor of the model and optimizer state, copied."""
    out: dict[str, torch.Tensor] = {}

    def walk(tree: object, prefix: str) -> None:
        if isinstance(tree, dict):
            for key, value in tree.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(tree, torch.Tensor):
            out[prefix.rstrip(".")] = tree.detach().clone()

    walk(state.state_dict(), "")
    return out


def assert_bitwise(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    unequal = [k for k in expected if not torch.equal(actual[k], expected[k])]
    assert not unequal, f"{len(unequal)} tensors differ, e.g. {unequal[:3]}"


def worker(rank: int, root: str, store: str, overlap: bool) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        checkpoints_dir = Path(root)
        model, optimizer = build(0)
        mo, train_state = ModelOptimizerState(model, optimizer), TrainState()
        state = {"model_optim": mo, "train": train_state, f"rng_rank{rank}": RNGState()}
        manager = CheckpointManager(checkpoints_dir, keep_last=3, rank=rank)
        if overlap:  # parameters and moments copied beside the next step, whose optimizer.step() waits
            manager.overlap_staging([optimizer])

        train(model, optimizer, 2, rank)
        train_state.step = 2
        manager.save(2, state)  # synchronous: committed on return
        assert [p.name for p in layout.committed(checkpoints_dir)] == ["step_00000002"]

        train(model, optimizer, 3, rank)
        train_state.step = 5
        expected_5 = snapshot(mo)
        returned = manager.save(5, state, blocking=False)
        assert returned == checkpoints_dir / "step_00000005" and manager.pending
        # Not committed yet: a crash now would leave step 2 as the newest checkpoint.
        assert [p.name for p in layout.committed(checkpoints_dir)] == ["step_00000002"]
        assert (checkpoints_dir / ".tmp-step_00000005").is_dir()

        # Training goes on while the shards are written: the staged copy must not see these updates.
        train(model, optimizer, 4, rank)
        train_state.step = 9
        assert any(not torch.equal(t, expected_5[k]) for k, t in snapshot(mo).items())
        expected_9 = snapshot(mo)
        manager.save(9, state, blocking=False)  # commits step 5 first
        assert [p.name for p in layout.committed(checkpoints_dir)][:2] == ["step_00000005", "step_00000002"]
        train(model, optimizer, 2, rank)
        deadline = time.monotonic() + 120
        while manager.pending and time.monotonic() < deadline:  # committed once written: no save, no wait()
            manager.poll()
            time.sleep(0.01)
        assert not manager.pending
        if rank == 0:
            assert layout.committed(checkpoints_dir)[0].name == "step_00000009"
        manager.wait()  # still collective (every rank meets here), nothing left to commit
        manager.wait()  # nothing pending: a no-op
        names = [p.name for p in layout.committed(checkpoints_dir)]
        assert names == ["step_00000009", "step_00000005", "step_00000002"]
        assert not list(checkpoints_dir.glob(".tmp-*"))
        manager.close()

        # A fresh model (other initial weights, no optimizer state yet) loads each checkpoint bitwise.
        for step, expected in ((9, expected_9), (5, expected_5)):
            fresh_model, fresh_optimizer = build(1)
            fresh, fresh_train = ModelOptimizerState(fresh_model, fresh_optimizer), TrainState()
            fresh_state = {"model_optim": fresh, "train": fresh_train, f"rng_rank{rank}": RNGState()}
            policy = "auto" if step == 9 else str(checkpoints_dir / layout.checkpoint_name(step))
            loaded = CheckpointManager(checkpoints_dir, keep_last=3, rank=rank).resume(fresh_state, policy)
            assert loaded == checkpoints_dir / layout.checkpoint_name(step)
            assert fresh_train.step == step
            assert_bitwise(snapshot(fresh), expected)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("overlap", [False, True], ids=["staged-in-save", "staged-beside-next-step"])
def test_async_save_is_staged_before_returning_and_resumes_bitwise(tmp_path: Path, overlap: bool):
    args = (str(tmp_path / "checkpoints"), str(tmp_path / "store"), overlap)
    start_ranks(worker, WORLD_SIZE, *args)
