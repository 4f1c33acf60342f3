"""The one supervisor loop (hpctrain.launch.supervisor) over real processes: a site whose workers are small
Python processes told how to end, per generation and rank. The loop the local launcher and every Slurm
task's agent run: a fault answered by a restart of every rank, a stop signal forwarded (also to a worker
started after it came), the generation moved by another supervisor, no restart where none is allowed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.launch.supervision import Outcome, RestartBook, Stalls
from hpctrain.launch.supervisor import Supervisor, Worker
from hpctrain.rundir import RunDir

# How a worker ends: an exit status after a sleep, or ("stop", s): sleeps until SIGTERM, then exits 3 (saved).
# A stopping worker starts with SIGTERM blocked and takes it once its handler is in (a signal sent while the
# interpreter starts is held, not lost: what hpctrain's worker does first of all).
SCRIPT = """
import signal, sys, time
how, after = {how!r}, {after!r}
if how == "stop":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
    time.sleep(after)
    sys.exit(0)
time.sleep(after)
sys.exit(how)
"""


class Shells:
    """A site of ``ranks`` local workers; ``plan[(generation, rank)]``: (how, after) its worker ends."""

    host = "here"
    interactive = True

    def __init__(self, run_dir: Path, ranks: int, plan: dict[tuple[int, int], tuple], shared: bool = False):
        self.run_dir, self.ranks, self.plan, self.shared = run_dir, ranks, plan, shared
        self.started: list[tuple[int, int]] = []

    def begin(self, generation: int) -> list[int]:
        return list(range(self.ranks))

    def spawn(self, rank: int, generation: int) -> Worker:
        how, after = self.plan.get((generation, rank), (0, 0.0))
        code = SCRIPT.format(how=how, after=after)
        self.started.append((generation, rank))
        held = how == "stop"
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            start_new_session=True,
            preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})) if held else None,
        )
        return Worker(rank, proc)

    def key(self, generation: int) -> str:
        return f"k.g{generation}"

    def stalls(self, generation: int) -> Stalls:
        return Stalls(self.run_dir, None, "k", generation, True)

    def grace_s(self, generation: int) -> float:
        return 0.0

    def unhealthy(self, rank: int, why: str) -> None:
        return None

    def lost(self, outcome: Outcome, hung: bool, ended: float, first_step: int) -> None:
        return None

    def culprit(self, outcome: Outcome, key: str, ended: float, restarts: bool) -> Outcome:
        return outcome


def _cfg(restarts: int) -> Config:
    return to_typed(compose([f"cluster.max_restarts={restarts}"]))


def _actions(run_dir: Path) -> list[str]:
    return [r["action"] for r in RunDir(run_dir).read_answers()]


def test_a_failed_rank_restarts_every_rank_once_and_the_run_ends_clean(tmp_path: Path):
    site = Shells(tmp_path, 2, {(0, 1): (1, 0.0), (0, 0): ("stop", 30.0)})
    ended = Supervisor(site, RestartBook(tmp_path, "j", 2, 3), _cfg(2)).run()
    assert ended.failures == [] and ended.code is None and ended.signal is None, ended
    assert sorted(site.started) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]  # both ranks again, not only the failed one
    assert _actions(tmp_path) == ["restart"]
    (record,) = RunDir(tmp_path).read_answers()
    assert (record["rank"], record["generation"]) == (1, 0), record
    assert [w.proc.returncode for w in ended.workers] == [0, 0]


def test_without_restarts_the_first_failure_ends_it_unanswered(tmp_path: Path):
    site = Shells(tmp_path, 2, {(0, 1): (5, 0.0), (0, 0): ("stop", 30.0)})
    ended = Supervisor(site, None, _cfg(0)).run()
    assert [(f.rank, f.returncode) for f in ended.failures] == [(1, 5)], ended.failures
    assert ended.action is None and site.started == [(0, 0), (0, 1)]
    assert RunDir(tmp_path).read_answers() == []  # no policy asked, nothing recorded


def test_restarts_used_up_the_policy_ends_the_run_and_says_why(tmp_path: Path):
    plan = {(g, 0): (1, 0.2 * g) for g in range(3)}
    site = Shells(tmp_path, 1, plan)
    ended = Supervisor(site, RestartBook(tmp_path, "j", 1, 9), _cfg(1)).run()
    assert _actions(tmp_path) == ["restart", "none: restarts used up"]
    assert ended.failures and ended.action is not None and site.started == [(0, 0), (1, 0)]
    (fault,) = RunDir(tmp_path).read_faults()
    assert fault["action"].startswith("the run ends"), fault


def test_a_stop_signal_reaches_every_worker_also_one_started_after_it(tmp_path: Path):
    site = Shells(tmp_path, 2, {(0, 0): ("stop", 30.0), (0, 1): ("stop", 30.0)})
    supervisor = Supervisor(site, None, _cfg(0))
    supervisor.on_signal(signal.SIGTERM)  # before any worker exists: the watch forwards it once they do
    started = time.monotonic()
    ended = supervisor.run()
    assert time.monotonic() - started < 20, "the workers were told to stop"
    assert ended.signal == signal.SIGTERM and ended.failures == []
    assert [w.proc.returncode for w in ended.workers] == [3, 3]  # each saved and stopped


def test_a_generation_moved_by_another_supervisor_kills_its_workers_and_starts_the_next(tmp_path: Path):
    """Slurm tasks share a job start: another agent's restart moves the generation under this one."""
    site = Shells(tmp_path, 1, {(0, 0): ("stop", 60.0)}, shared=True)
    book = RestartBook(tmp_path, "j", 2, 3)
    other = RestartBook(tmp_path, "j", 2, 3)
    moved = threading.Timer(
        1.0, lambda: other.decide(0, Outcome(5, "node9", "was killed by SIGKILL"), time.time(), 0, "k.g0")
    )
    moved.start()
    started = time.monotonic()
    ended = Supervisor(site, book, _cfg(2)).run()
    moved.join()
    assert time.monotonic() - started < 30, "the first generation's worker was killed, not waited for"
    assert site.started == [(0, 0), (1, 0)] and ended.failures == []
    assert _actions(tmp_path) == ["restart"]  # the other supervisor's answer; this one answered nothing


@pytest.mark.parametrize("code", [0, 3])
def test_a_clean_or_saved_exit_is_no_fault(tmp_path: Path, code: int):
    site = Shells(tmp_path, 1, {(0, 0): (code, 0.0)})
    ended = Supervisor(site, RestartBook(tmp_path, "j", 2, 3), _cfg(2)).run()
    assert ended.failures == [] and site.started == [(0, 0)] and not RunDir(tmp_path).read_answers()
