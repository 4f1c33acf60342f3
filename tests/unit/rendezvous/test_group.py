"""Joining the process group (hpctrain.rendezvous.group) in one process: a rank that cannot join is named,
within the timeout."""

from __future__ import annotations

import pytest

from hpctrain.launch.local import free_port
from hpctrain.rendezvous.env import DistEnv
from hpctrain.rendezvous.group import init_distributed


def test_a_rank_that_cannot_join_is_named():
    # Rank 1 of 2 dials a rendezvous where nobody listens: it fails within the timeout, naming itself.
    env = DistEnv(
        rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=free_port("127.0.0.1"),
        hostname="node7",
    )
    with pytest.raises(
        RuntimeError, match=r"rank 1 on node7 could not join the 2-rank process group at 127\.0\.0\.1"
    ):
        init_distributed(env, timeout_s=1)
