"""A checkpoint that does not fit the model is refused in one line before anything loads
(hpctrain.checkpoint.mismatch), and the checkpoint's collectives are no-ops in one process
(hpctrain.checkpoint.ranks)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain.checkpoint.mismatch import refuse_mismatch
from hpctrain.checkpoint.ranks import barrier, gather_over_ranks, sum_over_ranks, world_size
from hpctrain.errors import CheckpointMismatch


class _State:
    saved_names = ()  # no tied aliases

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"w": (4, 3), "b": (4,)}


def test_a_checkpoint_of_another_shape_or_other_names_is_refused_naming_the_first(tmp_path: Path):
    state = {"model_optim": _State()}
    fits = {"model_optim.model.w": torch.Size([4, 3]), "model_optim.model.b": torch.Size([4])}
    refuse_mismatch(tmp_path, {k: SimpleNamespace(size=v) for k, v in fits.items()}, state)
    wider = {**fits, "model_optim.model.w": torch.Size([4, 5])}
    with pytest.raises(CheckpointMismatch, match=r"w has shape \[4, 5\] in the checkpoint, \[4, 3\] in the"):
        refuse_mismatch(tmp_path, {k: SimpleNamespace(size=v) for k, v in wider.items()}, state)
    fewer = {"model_optim.model.w": torch.Size([4, 3])}
    with pytest.raises(CheckpointMismatch, match=r"b is in the model \[4\] but not in the checkpoint"):
        refuse_mismatch(tmp_path, {k: SimpleNamespace(size=v) for k, v in fewer.items()}, state)


def test_the_collectives_are_no_ops_in_one_process():
    assert world_size() == 1 and sum_over_ranks([1, 2], None) == [1, 2]
    assert gather_over_ranks("x", None) == ["x"]
    barrier()
