"""Unpickling without running code (hpctrain.checkpoint.safe): a crafted .metadata is refused before it runs;
RNG states round-trip as plain data."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.checkpoint.safe import UnsafeCheckpoint, decode, encode, load_metadata
from tests.support.exploit import Exploit


def test_a_crafted_metadata_pickle_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(UnsafeCheckpoint, match="system"):
        load_metadata(pickle.dumps(Exploit(marker)))
    assert not marker.exists()


def test_rng_state_round_trips_without_pickle() -> None:
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    back = decode(encode(state))
    assert back["python"] == state["python"]
    assert back["numpy"][0] == "MT19937" and np.array_equal(back["numpy"][1], state["numpy"][1])
    assert back["numpy"][1].dtype == state["numpy"][1].dtype and back["numpy"][2:] == state["numpy"][2:]
    assert torch.equal(back["torch"], state["torch"])
