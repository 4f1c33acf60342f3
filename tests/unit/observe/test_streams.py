"""A console whose reader went away (hpctrain.observe.streams, issue 41): ``… | tee log`` and Ctrl-C kills tee
first. Every writer (rank 0's rich console and progress bar, print, logging's stream handlers) goes on without
an exception, its descriptor pointed at /dev/null; other errors still raise."""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.progress import Progress

from hpctrain.config.schema import LoggerConfig
from hpctrain.observe.loggers import ConsoleLogHandler, Observer, console_lost, open_console
from hpctrain.observe.streams import ConsoleFile, GuardedStream, guarded_std_streams


@pytest.fixture
def widowed() -> Iterator[int]:
    """The write end of a pipe whose reader is gone (tee, killed by the Ctrl-C)."""
    read, write = os.pipe()
    os.close(read)
    yield write
    os.close(write)


def _points_at_devnull(fd: int) -> bool:
    return os.path.realpath(f"/proc/self/fd/{fd}") == os.devnull


def test_a_console_file_whose_reader_went_away_never_raises(widowed: int) -> None:
    duplicate = os.dup(widowed)
    console = ConsoleFile.open(duplicate)
    assert console.write("step 1\n") == len("step 1\n")  # line-buffered: flushed, EPIPE, swallowed
    assert console.lost and _points_at_devnull(duplicate)
    console.write("x" * 100_000)
    console.flush()
    console.close()


def test_rank_0s_console_and_progress_bar_survive_the_pipe_and_the_log_keeps_the_lines(
    widowed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCTRAIN_CONSOLE_FD", str(os.dup(widowed)))
    console = open_console()
    assert console is not None
    handler = ConsoleLogHandler(console)
    kept = logging.getLogger("hpctrain.test_streams")
    kept.propagate = False
    kept.setLevel(logging.INFO)
    to_file = logging.FileHandler(tmp_path / "rank0.log")
    kept.addHandler(handler)
    kept.addHandler(to_file)
    try:
        kept.info("Stopped by Ctrl-C after step 7; checkpoint saved (0.1 s)")  # rich raised SystemExit(1)
        assert console_lost(console)
        kept.info("after the pipe went")
    finally:
        kept.removeHandler(handler)
        kept.removeHandler(to_file)
        to_file.close()
    assert (tmp_path / "rank0.log").read_text().splitlines() == [
        "Stopped by Ctrl-C after step 7; checkpoint saved (0.1 s)",
        "after the pipe went",
    ]
    # A progress bar on a lost console stops; the steps go on as lines (the rank's log).
    observer = Observer(LoggerConfig(), tmp_path, console, {})
    observer._progress = Progress(console=console)
    observer.log({"step": 1, "loss": 1.0})
    assert observer._progress is None
    observer.close()


def test_guarded_std_streams_drop_a_lost_readers_text_and_are_put_back(widowed: int) -> None:
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.dup(widowed), "w")), line_buffering=False)
    before = sys.stdout, sys.stderr
    sys.stdout = stream  # type: ignore[assignment]
    try:
        with guarded_std_streams():
            assert isinstance(sys.stdout, GuardedStream)
            print("x" * 100_000)  # larger than the buffer: written, EPIPE
            handler = logging.StreamHandler(sys.stdout)  # Hydra's console handler: ext://sys.stdout
            handler.emit(logging.makeLogRecord({"msg": "Stopping: the workers finish their step"}))
            assert sys.stdout.lost and _points_at_devnull(stream.fileno())
        assert sys.stdout is stream
        stream.write("at exit")
        stream.flush()  # the interpreter's flush at exit: /dev/null now, no exit status 120
    finally:
        sys.stdout = before[0]
        stream.close()


def test_a_command_that_only_writes_ends_when_its_reader_goes(widowed: int) -> None:
    """``hpctrain logs -f RUN | grep -m1 …``: the follow must end with grep, once, and exit cleanly."""
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.dup(widowed), "w")), line_buffering=True)
    guarded = GuardedStream(stream, end=True)  # type: ignore[arg-type]
    with pytest.raises(BrokenPipeError):
        guarded.write("a line of the log\n")
    guarded.write("the rest goes nowhere\n")
    guarded.flush()
    assert _points_at_devnull(stream.fileno())
    stream.close()


def test_other_errors_still_raise(tmp_path: Path) -> None:
    closed = io.TextIOWrapper(io.BytesIO())
    guarded = GuardedStream(closed)  # type: ignore[arg-type]
    closed.close()
    with pytest.raises(ValueError):
        guarded.write("a closed file is a bug of ours, not a reader gone")
