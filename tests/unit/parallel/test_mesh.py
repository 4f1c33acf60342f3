"""The device mesh (hpctrain.parallel.mesh): none when every degree is 1; a layout that needs more ranks than
the process group has is refused naming both."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config.shape import Degrees
from hpctrain.parallel.mesh import build_mesh


def test_one_process_has_no_mesh_and_is_data_parallel_rank_0() -> None:
    dims = build_mesh(Degrees(), torch.device("cpu"))
    assert dims.mesh is None and not any(dims.has(d) for d in ("pp", "dp_replicate", "dp_shard", "tp"))
    assert (dims.dp_rank, dims.pp_rank, dims.pp_group) == (0, 0, None)


def test_degrees_that_need_more_ranks_are_refused(one_rank: torch.device) -> None:
    with pytest.raises(
        RuntimeError, match=r"the degrees dp_shard=2 × tp=2 need 4 ranks, the process group has 1"
    ):
        build_mesh(Degrees(dp_shard=2, tp=2), one_rank)
