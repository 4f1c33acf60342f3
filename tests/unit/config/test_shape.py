"""The run's shape (hpctrain.config.shape): world size and parallel degrees, derived once."""

from __future__ import annotations

from hpctrain.config.shape import Degrees, degrees, world_size
from tests.support.configs import SEVEN_B, typed


def test_a100x32_world_and_3d_degrees():
    cfg = typed(*SEVEN_B, "parallel=3d", "model.tie_embeddings=false")
    assert world_size(cfg) == 4 * 8
    assert degrees(cfg) == Degrees(pp=2, dp_shard=8, tp=2)  # dp derived: 32 / (pp 2 × tp 2)
