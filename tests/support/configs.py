"""Composed, validated configs for tests of the planner and the checks before submission."""

from __future__ import annotations

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.config.validate import validate

GIB = 2**30
# A 6.4B GPT (LLaMA-7B's depth and width; the tiny default vocabulary of 256 bytes and sequence of 64 are
# kept, as in the issue: its parameters and AdamW state alone, 16 bytes per parameter, exceed an A100's 80
# GiB under DDP, whatever the activations).
SEVEN_B = ["model=gpt", "model.n_layers=32", "model.d_model=4096", "model.n_heads=32", "cluster=a100x32"]


def typed(*overrides: str) -> Config:
    """The config ``hpctrain OVERRIDES`` would run, validated."""
    cfg = to_typed(compose(list(overrides)))
    validate(cfg)
    return cfg
