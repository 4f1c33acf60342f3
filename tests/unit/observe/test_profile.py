"""A profiler window (hpctrain.observe.profile) in this process: where its traces go (beside TensorBoard's
scalars when logger=tensorboard) and a Chrome trace per rank from torch.profiler. (On 2 ranks of a real run:
tests/e2e/observe/test_profile.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpctrain.config.compose import compose, to_typed
from hpctrain.observe.profile import profile_dir, start_profiler
from hpctrain.rundir import RunDir


def test_traces_go_where_tensorboard_looks_and_hold_the_ops(tmp_path: Path) -> None:
    plain = to_typed(compose(["trainer.profile=2:3"]))
    assert profile_dir(plain, tmp_path) == RunDir(tmp_path).profile
    board = to_typed(compose(["trainer.profile=2:3", "logger=tensorboard"]))
    where = profile_dir(board, tmp_path)
    assert where == RunDir(tmp_path).tensorboard / "plugins" / "profile" / "steps_2-3"
    profiler = start_profiler(where, rank=3, device=torch.device("cpu"))
    torch.ones(8, 8) @ torch.ones(8, 8)
    profiler.stop()
    (trace,) = where.glob("rank3*.pt.trace.json")
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert "aten::mm" in names
