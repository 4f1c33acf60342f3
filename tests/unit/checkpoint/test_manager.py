"""The checkpoint manager (hpctrain.checkpoint.manager) in one process, without a process group: per-rank RNG
streams saved and matched by rank on resume."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import RNGState, TrainState


def test_rng_streams_are_matched_by_rank(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """In one process (no process group): a checkpoint with streams of ranks 0 and 1, loaded as rank 2 of
    3 (no stream: a fresh, deterministic one) and as rank 1 (its own stream restored)."""
    root = tmp_path / "checkpoints"
    torch.manual_seed(100)
    rank0 = RNGState()
    torch.manual_seed(101)
    saved = {"train": TrainState(step=7), "rng_rank0": rank0, "rng_rank1": RNGState()}
    CheckpointManager(root, keep_last=1, rank=0).save(7, saved)
    after_save = torch.rand(3)  # rank 1's stream, as saved

    def load_as(rank: int) -> torch.Tensor:
        torch.manual_seed(1000 + rank)  # what the trainer does before building RNGState
        state = {"train": TrainState(), f"rng_rank{rank}": RNGState()}
        assert CheckpointManager(root, keep_last=1, rank=rank).resume(state, "auto") == root / "step_00000007"
        assert state["train"].step == 7
        return torch.rand(3)

    with caplog.at_level(logging.INFO, logger="hpctrain.checkpoint.manager"):
        assert torch.equal(load_as(1), after_save)
        fresh = load_as(2)
    assert (
        "step_00000007 has no RNG state for rng_rank2 (saved by 2 rank(s)): fresh stream seeded"
        in caplog.text
    )
    assert torch.equal(load_as(2), fresh), "the fresh stream is deterministic"
    torch.manual_seed(1002)
    assert not torch.equal(torch.rand(3), fresh), "and not the stream the rank had before loading"


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model[2].bias.requires_grad_(False)  # a frozen parameter: no optimizer state
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def test_optimizer_state_is_made_as_torchs_step_makes_it_without_the_step() -> None:
    """allocate_optimizer_state creates the tensors (names, shapes, dtypes, devices) that torch's step at lr 0
    creates, and leaves an optimizer it cannot mirror (Adafactor reads values in its step) to torch."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    from hpctrain.checkpoint.state import allocate_optimizer_state

    def look(optimizer: torch.optim.Optimizer) -> list[dict[str, object]]:
        return [
            {k: (v.shape, v.dtype, v.device) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for s in optimizer.state.values()
        ]

    for make in (
        lambda ps: torch.optim.AdamW(ps, lr=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adafactor(ps, lr=0.1),
    ):
        model, _ = _trained()
        ours, torchs = make(model.parameters()), make(model.parameters())
        made = allocate_optimizer_state(ours)
        _init_optim_state(torchs)
        assert made == (not isinstance(ours, torch.optim.Adafactor)), type(ours).__name__
        assert look(ours) == (look(torchs) if made else []), type(ours).__name__
        assert all(p.grad is None for p in model.parameters()), "no gradient left behind"


def test_a_fresh_optimizer_resumes_bitwise_and_stays_fresh_when_nothing_loads(tmp_path: Path) -> None:
    """Resume into a fresh optimizer (its state made without torch's step at lr 0): every tensor and the next
    step bitwise equal to the saved run's; when no checkpoint loads (the only one is damaged), the optimizer
    is left without state, as a fresh run's."""
    from hpctrain.checkpoint.state import ModelOptimizerState
    from hpctrain.rundir import checkpoints as layout

    x = torch.randn(5, 8)
    model, optimizer = _trained()
    for _ in range(2):
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
    root = tmp_path / "checkpoints"
    saved = {"model_optim": ModelOptimizerState(model, optimizer)}
    CheckpointManager(root, keep_last=1, rank=0).save(2, saved)

    other, fresh = _trained(seed=1)
    assert CheckpointManager(root, keep_last=1, rank=0).resume(
        {"model_optim": ModelOptimizerState(other, fresh)}, "auto"
    ) == root / layout.checkpoint_name(2)
    for ours, theirs in zip(other.parameters(), model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    for param_ours, param_theirs in zip(other.parameters(), model.parameters(), strict=True):
        state_ours, state_theirs = fresh.state.get(param_ours, {}), optimizer.state.get(param_theirs, {})
        assert state_ours.keys() == state_theirs.keys()
        assert all(torch.equal(state_ours[k], state_theirs[k]) for k in state_theirs)
    for m, o in ((model, optimizer), (other, fresh)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), model.parameters(), strict=True))

    shard = next((root / layout.checkpoint_name(2)).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again, untouched = _trained(seed=1)
    manager = CheckpointManager(root, keep_last=1, rank=0)
    assert manager.resume({"model_optim": ModelOptimizerState(again, untouched)}, "auto") is None
    assert not manager.state_touched and not untouched.state


def test_a_state_built_for_a_checkpoint_is_reported_when_none_loads(tmp_path: Path) -> None:
    """``fresh=False`` (the model built without its random init, for a checkpoint to overwrite): when that
    checkpoint does not load, ``state_touched`` tells the trainer to build the state again; when it loads,
    the state is the checkpoint's and nothing is reported."""
    from hpctrain.checkpoint.state import ModelOptimizerState
    from hpctrain.rundir import checkpoints as layout

    model, optimizer = _trained()
    root = tmp_path / "checkpoints"
    CheckpointManager(root, keep_last=1, rank=0).save(
        1, {"model_optim": ModelOptimizerState(model, optimizer)}
    )
    manager = CheckpointManager(root, keep_last=1, rank=0)
    other, fresh = _trained(seed=1)
    state = {"model_optim": ModelOptimizerState(other, fresh)}
    assert manager.resume(state, "auto", fresh=False) == root / layout.checkpoint_name(1)
    assert not manager.state_touched
    shard = next((root / layout.checkpoint_name(1)).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-8])
    for fresh_state, touched in ((True, False), (False, True)):
        manager = CheckpointManager(root, keep_last=1, rank=0)
        other, fresh = _trained(seed=1)
        state = {"model_optim": ModelOptimizerState(other, fresh)}
        assert manager.resume(state, "auto", fresh=fresh_state) is None
        assert manager.state_touched == touched
