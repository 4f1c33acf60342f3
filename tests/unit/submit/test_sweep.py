"""Sweep members (hpctrain.submit.sweep): the grid of a ``-m`` command, each checked by the precheck."""

from __future__ import annotations

import pytest

from hpctrain.submit.submission import precheck
from hpctrain.submit.sweep import sweep_members


def test_precheck_validates_every_sweep_member():
    assert sweep_members(["optim.lr=1e-3,3e-4", "trainer.seed=1,2", "model=gpt"]) == [
        ["optim.lr=0.001", "trainer.seed=1", "model=gpt"],
        ["optim.lr=0.001", "trainer.seed=2", "model=gpt"],
        ["optim.lr=0.0003", "trainer.seed=1", "model=gpt"],
        ["optim.lr=0.0003", "trainer.seed=2", "model=gpt"],
    ]
    precheck(["optim.lr=1e-3,3e-4"], multirun=True)
    with pytest.raises(ValueError, match=r"trainer\.global_batch_size=30"):
        precheck(["trainer.global_batch_size=32,30"], multirun=True)
