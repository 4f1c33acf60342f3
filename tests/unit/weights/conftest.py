"""A run directory with one committed checkpoint of the built-in GPT, written in this process (no training:
the weights a run of these overrides starts from, saved as the trainer saves them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import ModelOptimizerState, TrainState
from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import write_run_config
from hpctrain.models import build_model
from hpctrain.rundir import RunDir

GPT = ["model.n_layers=2", "model.d_model=32", "model.n_heads=4", "model.seq_len=16", "trainer.max_steps=2"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("weights") / "run"
    composed = compose([*GPT, f"hydra.run.dir={run}"])
    write_run_config(run, composed)
    torch.manual_seed(0)
    model = build_model(to_typed(composed).model)
    optimizer = torch.optim.AdamW(model.parameters())
    state = {
        "model_optim": ModelOptimizerState(model, optimizer, {"head.weight": "tok_emb.weight"}),
        "train": TrainState(step=2),
    }
    CheckpointManager(RunDir(run).checkpoints, keep_last=2, rank=0).save(2, state)
    torch.save(model.state_dict(), run / "weights.pt")  # what the checkpoint holds, to compare with
    return run
