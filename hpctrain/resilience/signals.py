"""Pre-emption and time-limit signals, noticed on every rank and acted on by all at a step boundary.

Slurm sends the warning signal (``--signal=USR2@<lead>``, never USR1, which NCCL may take) and, on pre-emption
or at the time limit, SIGTERM to every task. A handler here only sets a flag: saving a checkpoint from inside
a signal handler would run collectives at an arbitrary point of the step. At the next step boundary the ranks
agree on the flags with one all-reduce (MAX), so a signal that reached any rank stops all of them together.
submitit installs its own USR2 handler that checkpoints global rank 0 only (submitit #9); ours replaces it.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

WALLTIME = 1000  # stop code for the walltime guard; signal numbers are the other codes


# Set in every rank the local launcher starts: the process whose death must end the rank.
LAUNCHER_PID_ENV = "HPCTRAIN_LAUNCHER_PID"
# The stop signals a worker starts with blocked (hpctrain.launch.spawn): one sent before the worker's handlers
# are in (a Ctrl-C or a pre-emption while the rank starts) is held, not lost, nor fatal (USR2's default
# action, a KeyboardInterrupt for SIGINT); the worker takes them once its handlers are in (release_held).
HELD_AT_START = frozenset({signal.SIGUSR2, signal.SIGTERM, signal.SIGINT})


def release_held() -> None:
    """Take the stop signals the worker was started with blocked: any that came meanwhile reach the handlers
    now (a worker started otherwise, by torchrun say, has none blocked: nothing changes)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_AT_START)


def describe(code: int) -> str:
    """The stop's cause as the stop line says it (``Stopped by <this> after step N``)."""
    if code == WALLTIME:
        return "the time limit is near (walltime guard)"
    if code == signal.SIGINT and LAUNCHER_PID_ENV in os.environ:
        # Only the local launcher sends its ranks SIGINT, and only for a Ctrl-C at its terminal. (Under Slurm,
        # SIGINT can be the warning signal cluster.signal names: its name is said as it is.)
        return "Ctrl-C"
    return f"SIG{signal.Signals(code).name.removeprefix('SIG')}"


class StopSignals:
    """Remember the first stop signal this process receives."""

    def __init__(self, names: set[str]) -> None:
        self.received = 0
        for name in sorted(names):
            self.listen(name)

    def listen(self, name: str) -> None:
        signal.signal(getattr(signal, f"SIG{name}"), self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.received:
            self.received = signum
