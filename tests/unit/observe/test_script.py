"""A script's metrics (hpctrain.log_metrics → hpctrain.observe.script): rank 0 writes one line per call;
outside a run it does nothing; a bad value is a ValueError naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain import log_metrics
from hpctrain.observe.script import RUN_DIR_ENV
from hpctrain.rundir import RunDir


def test_rank_0_writes_a_line_and_bad_values_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    log_metrics(1, loss=1.0)  # outside a run: nothing, no error
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    log_metrics(3, loss=0.5, lr=1e-3)
    monkeypatch.setenv("RANK", "1")
    log_metrics(3, loss=9.0)  # another rank: nothing
    lines = [json.loads(line) for line in RunDir(tmp_path).metrics.read_text().splitlines()]
    assert [(r["step"], r["loss"], r["lr"]) for r in lines] == [(3, 0.5, 1e-3)]
    for bad, named in (({"loss": float("nan")}, "loss=nan"), ({"loss": "x"}, "loss='x'")):
        with pytest.raises(ValueError, match=named):
            log_metrics(4, **bad)
    with pytest.raises(ValueError, match="step=-1"):
        log_metrics(-1, loss=1.0)
