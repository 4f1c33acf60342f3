"""A metric that is a list of numbers (a mixture of experts' ``moe_load``: one share per expert) is written
whole to metrics.jsonl and charted in TensorBoard as one series per entry. In-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config.schema import LoggerConfig
from hpctrain.observe.loggers import Observer, tensorboard_tag


def test_a_list_of_numbers_is_one_tensorboard_series_per_entry(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = LoggerConfig(progress_bar=False, tensorboard=True)
    observer = Observer(cfg, tmp_path, None, {})
    observer.start(0, 1, None)
    observer.log({"step": 1, "loss": 2.0, "moe_load": [0.25, 0.75], "moe_dropped": 0})
    observer.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert record["moe_load"] == [0.25, 0.75]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"moe/load/0", "moe/load/1", "moe/dropped", "loss/train"} <= tags  # one series per expert
    assert [e.value for e in events.Scalars(tensorboard_tag("moe_load/1"))] == [0.75]
