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
