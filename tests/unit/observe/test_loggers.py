"""What rank 0 records about progress (hpctrain.observe.loggers) and where every rank logs
(hpctrain.observe.logs), in this process: metrics.jsonl and TensorBoard hold the same numbers, a resume
drops the records past its step, a log line per record; each rank's log file."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain.config.compose import compose, to_typed
from hpctrain.observe.loggers import Observer, format_record, tensorboard_tag
from hpctrain.observe.logs import setup_logging
from hpctrain.rundir import RunDir


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger without handlers (as in a fresh worker: one an earlier test of this process left may
    write to a stream pytest has closed since), its handlers and level put back afterwards (setup_logging is
    a worker's, for life)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        yield root
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers, root.level = handlers, level


def test_jsonl_and_tensorboard_hold_the_same_numbers_and_a_resume_drops_later_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = to_typed(compose(["logger=[jsonl,tensorboard]"])).logger
    observer = Observer(cfg, tmp_path, None, {"x": 1})
    assert observer.start(0, 4, None) is None  # no W&B: no run id to keep
    with caplog.at_level(logging.INFO, logger="hpctrain.observe.loggers"):
        for step in (1, 2, 3):
            observer.log({"step": step, "loss": 1.0 / step, "straggler_host": "node1"})
    observer.close()
    assert "step 3 | loss 0.3333" in caplog.text
    records = RunDir(tmp_path).read_metrics()
    assert [(r["step"], r["loss"], r["straggler_host"]) for r in records] == [
        (s, 1.0 / s, "node1") for s in (1, 2, 3)
    ]
    events = EventAccumulator(str(RunDir(tmp_path).tensorboard))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars(tensorboard_tag("loss"))] == [
        (s, round(1.0 / s, 6)) for s in (1, 2, 3)
    ]
    assert "straggler_host" not in events.Tags()["scalars"]  # names stay in metrics.jsonl
    resumed = Observer(to_typed(compose(["logger=jsonl"])).logger, tmp_path, None, {})
    resumed.start(2, 4, None)  # from step 2's checkpoint: step 3 is trained again
    resumed.close()
    assert [json.loads(line)["step"] for line in RunDir(tmp_path).metrics.read_text().splitlines()] == [1, 2]


def test_a_record_reads_as_one_line() -> None:
    line = format_record({"step": 7, "loss": 1.23456, "lr": 3e-4, "tokens_per_s": 12345.6, "mfu": 0.123})
    assert line == "step 7 | loss 1.2346 | lr 3.00e-04 | 12,346 tok/s | mfu 12.3%"


def test_every_rank_logs_to_its_file_and_rank_0_to_the_console(
    tmp_path: Path, root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("HPCTRAIN_LAUNCHER_PID", raising=False)
    setup_logging(tmp_path, 2, console_handler=None)
    logging.getLogger("logs_check").info("hello from rank 2")
    assert capsys.readouterr().out == ""  # not rank 0: the file only
    setup_logging(tmp_path, 0, console_handler=None)
    logging.getLogger("logs_check").info("hello from rank 0")
    assert capsys.readouterr().out.endswith("hello from rank 0\n")
    for handler in root_logger.handlers:
        handler.flush()
    assert "rank2 INFO logs_check: hello from rank 2" in RunDir(tmp_path).log(2).read_text()
    assert "rank0 INFO logs_check: hello from rank 0" in RunDir(tmp_path).log(0).read_text()
