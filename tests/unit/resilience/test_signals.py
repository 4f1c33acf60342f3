"""Stop signals (hpctrain.resilience.signals) and the per-step stop question (hpctrain.resilience.stop) in one
process: a handler only remembers the first signal; the step boundary answers with its name, or the
walltime guard's, and nothing when there is nothing to stop for."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import torch

from hpctrain.resilience.signals import WALLTIME, StopSignals, describe
from hpctrain.resilience.stop import StopCheck

CPU = torch.device("cpu")


@pytest.fixture
def handlers() -> Iterator[None]:
    """SIGUSR2's and SIGTERM's handlers put back afterwards (StopSignals installs its own, for life)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("handlers")
def test_the_first_signal_is_remembered_and_stops_at_the_next_step() -> None:
    signals = StopSignals({"USR2", "TERM"})
    stop = StopCheck(signals, end_time=None, is_main=True, device=CPU)
    assert stop(0.1, 1.0) is None
    os.kill(os.getpid(), signal.SIGUSR2)  # what Slurm's --signal=USR2@lead delivers; it must not kill us
    os.kill(os.getpid(), signal.SIGTERM)
    assert signals.received == signal.SIGUSR2
    assert stop(0.1, 1.0) == "SIGUSR2" == describe(signal.SIGUSR2)


@pytest.mark.usefixtures("handlers")
def test_the_walltime_guard_of_rank_0_stops_before_the_time_limit() -> None:
    signals = StopSignals(set())
    soon = time.time() + 5  # two steps, 1.5 saves and the margin no longer fit
    assert StopCheck(signals, soon, is_main=True, device=CPU)(1.0, 10.0) == describe(WALLTIME)
    assert describe(WALLTIME) == "the time limit is near (walltime guard)"
    assert StopCheck(signals, soon, is_main=False, device=CPU)(1.0, 10.0) is None  # rank 0 decides
    assert StopCheck(signals, time.time() + 1e6, is_main=True, device=CPU)(1.0, 10.0) is None
