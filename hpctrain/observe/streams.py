"""Console output whose reader may go away, without taking the writer with it.

``python -m hpctrain … 2>&1 | tee log`` and Ctrl-C at the terminal: the terminal sends SIGINT to the whole
foreground process group, so ``tee`` dies at once while the launcher and its ranks (in sessions of their
own) go on to save. Their next write to the pipe fails with EPIPE (a terminal that hung up: EIO). Left to
itself, that error kills whoever writes: rich's console raises ``SystemExit(1)`` (and points *sys.stdout*,
a rank's log, at /dev/null), ``print`` raises BrokenPipeError, logging prints a "Logging error" traceback,
and the interpreter's own flush of sys.stdout at exit turns exit status 0 into 120. A lost console must cost
nothing but the console: every write here that finds its reader gone points the descriptor at /dev/null
(so later writes, a library's and the interpreter's flush at exit included, succeed and go nowhere) and
drops the text. The rank logs and the command's own hpctrain.log, files, keep every line.

Stdlib only: the CLI imports this before anything else, and it must stay torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

# EPIPE: a pipe whose reader died; EIO, ENXIO: a terminal that hung up (its session's controlling tty gone).
LOST_ERRNOS = frozenset({errno.EPIPE, errno.EIO, errno.ENXIO})


def is_lost(err: BaseException) -> bool:
    """Whether ``err`` says the stream's reader is gone (not a full disk, nor a closed file of ours)."""
    return isinstance(err, OSError) and err.errno in LOST_ERRNOS


def discard(fd: int) -> None:
    """Point ``fd`` at /dev/null, so that every later write to it succeeds and goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    except OSError:  # the descriptor is closed already: nothing will write to it
        pass
    finally:
        os.close(devnull)


def _discard_stream(stream: Any) -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):
        discard(stream.fileno())
    # What the failed write left in the stream's buffer now goes to /dev/null, not into the next write.
    with contextlib.suppress(AttributeError, OSError, ValueError):
        stream.flush()


class ConsoleFile(io.TextIOWrapper):
    """A text file over a console descriptor (rank 0's copy of the launcher's stdout) whose writes never
    raise for a reader that went away: the descriptor is pointed at /dev/null and :attr:`lost` is set."""

    lost = False

    @classmethod
    def open(cls, fd: int) -> ConsoleFile:
        # Line-buffered, as os.fdopen(fd, "w", buffering=1) was: a progress line appears as it is written.
        return cls(io.BufferedWriter(io.FileIO(fd, "w")), line_buffering=True)

    def write(self, text: str) -> int:
        if self.lost:
            return len(text)
        try:
            return super().write(text)
        except OSError as err:
            if not is_lost(err):
                raise
            self._lose()
            return len(text)

    def flush(self) -> None:
        if self.lost:
            return
        try:
            super().flush()
        except OSError as err:
            if not is_lost(err):
                raise
            self._lose()

    def _lose(self) -> None:
        self.lost = True
        with contextlib.suppress(OSError, ValueError):
            discard(self.fileno())
        with contextlib.suppress(OSError, ValueError):
            super().flush()  # the unwritten rest of the buffer, into /dev/null


class GuardedStream:
    """sys.stdout or sys.stderr, whose reader may go away: the same stream for every use (``print``, logging's
    stream handlers, Hydra's), but a write or flush that finds the reader gone points the descriptor at
    /dev/null and drops the text instead of raising."""

    def __init__(self, stream: TextIO, end: bool = False) -> None:
        self.stream = stream
        self.end = end  # raise the loss once (the descriptor discarded first): no one is left to serve
        self.lost = False

    def write(self, text: str) -> int:
        if self.lost:
            return len(text)
        try:
            return self.stream.write(text)
        except OSError as err:
            self._failed(err)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.lost:
            return
        try:
            self.stream.flush()
        except OSError as err:
            self._failed(err)

    def _failed(self, err: OSError) -> None:
        """A failed write or flush: raised again unless the reader is gone (then the stream is discarded,
        and raised once more only when ``end``)."""
        if not is_lost(err):
            raise err
        self._lose()
        if self.end:
            raise err

    def _lose(self) -> None:
        self.lost = True
        _discard_stream(self.stream)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...: the stream's own
        if name == "stream":  # not set yet (a copy being made): no recursion through this very method
            raise AttributeError(name)
        return getattr(self.stream, name)


@contextlib.contextmanager
def guarded_std_streams(end: bool = False) -> Iterator[None]:
    """sys.stdout and sys.stderr guarded (:class:`GuardedStream`) for the block; on leaving, a last flush
    through the guard, so the interpreter's own flush at exit finds nothing to write to a lost reader, and
    the streams the block found are put back (a caller in the same process, a test, gets its own back).

    ``end``: the first write that finds its reader gone raises (once; later writes go to /dev/null), for a
    command whose only work is its output (``hpctrain logs -f | grep -m1 …`` must end with grep). Otherwise
    (a command supervising ranks) the text is dropped and the command goes on."""
    before = sys.stdout, sys.stderr
    guarded = [
        GuardedStream(s, end) if s is not None and not isinstance(s, GuardedStream) else s for s in before
    ]
    sys.stdout, sys.stderr = guarded  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in guarded:
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        if (sys.stdout, sys.stderr) == tuple(guarded):
            sys.stdout, sys.stderr = before


def guard_std_streams() -> None:
    """sys.stdout and sys.stderr guarded for the rest of the process (a worker: it ends by ``os._exit``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream))
