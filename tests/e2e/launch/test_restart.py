"""Restart inside the allocation, locally (``cluster.max_restarts``): a rank killed with SIGKILL and, in the
restarted start, a rank stopped with SIGSTOP (a hang: its peer's watchdog notices, or, where the ranks log,
the launcher reading its stale heartbeat) are both answered by the launcher starting every rank again from
the newest checkpoint, in the same launch; the run ends bitwise equal to an uninterrupted one, and
restarts.jsonl and ``hpctrain status`` say what happened. A crash loop (a rank that fails before its first
step every time) ends after ``cluster.max_no_progress`` attempts, its cause in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpctrain.resilience import stacks
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, assert_same_state, hpctrain

STEPS = 12
RUN = [
    *FAST,
    "cluster.nproc=2",
    "model.dropout=0.1",  # every rank's RNG stream is restored too
    f"trainer.max_steps={STEPS}",
    "trainer.ckpt_every=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
]
# A stopped rank's peer waits in a collective: its watchdog calls it a hang after 2 s.
RESTARTS = ["cluster.max_restarts=2", "trainer.watchdog_min_s=2", "trainer.watchdog_factor=5"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run."""
    reference = tmp_path_factory.mktemp("restart") / "reference"
    done = hpctrain(*RUN, f"hydra.run.dir={reference}")
    assert done.returncode == 0, done.stderr[-3000:]
    return reference


def test_killed_then_stopped_rank_restart_in_the_launch_bitwise(tmp_path: Path, reference: Path) -> None:
    run = tmp_path / "run"
    faulty = hpctrain(*RUN, *RESTARTS, "faults.kill_at=1:6", "faults.stop_at=0:10@1", f"hydra.run.dir={run}")
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["restart", "restart"], records
    assert records[0]["rank"] == 1 and "SIGKILL" in records[0]["cause"] and records[0]["resume_step"] == 4
    assert records[1]["rank"] == 0 and "hung" in records[1]["cause"] and records[1]["resume_step"] == 8
    assert_same_state(run, reference, STEPS)
    status = hpctrain("status", str(run))
    assert status.returncode == 0 and "2 inside the allocation" in status.stdout, status.stdout
    # Issue 43, item 4: the goodput ledger of the three attempts tiles the run's wall time.
    ledger = json.loads((run / "goodput.json").read_text())
    buckets = ledger["buckets_s"]
    assert abs(sum(buckets.values()) - ledger["wall_s"]) <= 0.01 * ledger["wall_s"], ledger
    assert ledger["attempts"] == 3 and buckets["lost progress"] > 0 and buckets["restart gaps"] > 0, ledger
    assert buckets["checkpoint load"] > 0 and buckets["productive steps"] > 0, ledger
    line = r"^goodput +ETTR 0\.\d\d of \d+ s since submission \("
    assert re.search(line, status.stdout, re.M), status.stdout


def test_a_rank_stopped_where_the_ranks_log_is_caught_by_its_launcher(
    tmp_path: Path, reference: Path
) -> None:
    """Issue 43, item 6: rank 1 SIGSTOPped in step 6's report (after its update, before the logging
    collective its peer already waits in), where no watchdog limit is armed: the launcher reads its stale
    heartbeat, kills it and restarts the ranks, and the run ends bitwise equal to an uninterrupted one.
    Without a restart left, the run ends at once, naming the hung rank (it waited for the process group's
    timeout before: here 600 s)."""
    run, alone = tmp_path / "run", tmp_path / "alone"
    stop = ["faults.stop_at=1:6", "faults.stop_in=report"]
    result = hpctrain(*RUN, "cluster.max_restarts=1", *stop, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = RunDir(run).read_answers()
    assert (record["action"], record["rank"], record["resume_step"]) == ("restart", 1, 4), record
    assert record["cause"].startswith("hung: no heartbeat for ") and "stopped (SIGSTOP)" in record["cause"]
    assert "Stopping this rank (SIGSTOP) at step 6, report" in (run / "logs" / "rank1.log").read_text()
    assert_same_state(run, reference, STEPS)
    # Issue 43, item 2: its supervisor read where it stood (py-spy) before killing it; status names it.
    (dump,) = (run / "stacks").glob("stall-*-rank1/rank1.txt")
    assert stacks.innermost(dump.read_text()).startswith(
        "FaultInjector._stop_here (hpctrain/faults/__init__.py:"
    ), dump.read_text()
    shown = hpctrain("status", str(run)).stdout
    assert re.search(
        r"^stacks +.*rank 1: FaultInjector._stop_here \(hpctrain/faults/__init__\.py:\d+\)", shown, re.M
    ), shown

    ended = hpctrain(*RUN, *stop, "cluster.dist_timeout_s=600", f"hydra.run.dir={alone}")
    assert ended.returncode == 1 and "Traceback" not in ended.stderr, ended.stderr[-3000:]
    line = next(x for x in ended.stderr.splitlines() if x.startswith("hpctrain: rank 1 "))
    assert "hung: no heartbeat for " in line and "stopped (SIGSTOP)" in line, ended.stderr[-3000:]
    status = hpctrain("status", str(alone))
    error = next(x for x in status.stdout.splitlines() if x.startswith("error"))
    assert "rank 1 on " in error and "Hang" in error, status.stdout


def test_a_crash_loop_ends_after_max_no_progress_attempts(tmp_path: Path) -> None:
    run = tmp_path / "loop"
    args = [*RUN, "cluster.max_restarts=5", "cluster.max_no_progress=2", "faults.fail_at=0:1"]
    result = hpctrain(*args, f"hydra.run.dir={run}")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "crash loop: 2 attempts in a row without a new step" in last and "injected failure" in last, last
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["restart", "stopped"], records
    status = hpctrain("status", str(run))
    assert "crash loop" in status.stdout, status.stdout


def test_the_same_error_at_the_same_step_twice_is_not_restarted(tmp_path: Path) -> None:
    """Issue 41, item 4: a bug of the run's own (every attempt raises at step 6) is restarted once, then the
    run stops FAILED with the user's error as its cause, not after every restart and requeue."""
    run = tmp_path / "bug"
    result = hpctrain(*RUN, "cluster.max_restarts=3", "faults.fail_at=1:6", f"hydra.run.dir={run}")
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctrain: not restarted: the same error at step 6 twice"), last
    records = RunDir(run).read_answers()
    assert [(r["action"], r.get("step")) for r in records] == [("restart", 6), ("stopped", 6)], records
    status = hpctrain("status", str(run))
    shown = dict(line.split(None, 1) for line in status.stdout.splitlines() if line[:1].strip())
    assert status.returncode == 1 and shown["state"].startswith("FAILED"), status.stdout
    assert shown["error"].startswith("rank 1 on ") and "injected failure at step 6" in shown["error"], shown
    assert "not restarted: the same error at step 6 twice" in status.stdout, status.stdout


def test_a_killed_rank_is_the_cause_status_names(tmp_path: Path) -> None:
    """Issue 41, item 6: rank 1 SIGKILLed with restarts off (cluster=local's default); status named rank 0's
    "Connection reset by peer" and did not say what would have answered the fault."""
    run = tmp_path / "killed"
    result = hpctrain(*RUN, "faults.kill_at=1:3", f"hydra.run.dir={run}")
    assert result.returncode == 1, result.stderr[-3000:]
    status = hpctrain("status", str(run))
    error = next(line for line in status.stdout.splitlines() if line.startswith("error"))
    assert "rank 1 on " in error and "Killed: was killed by SIGKILL; cluster.max_restarts=N" in error, error


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.max_restarts=-1", "cluster.max_restarts"),
        ("cluster.max_no_progress=0", "cluster.max_no_progress"),
        ("faults.stop_at=1:2@x", "faults.stop_at"),
    ],
)
def test_bad_restart_keys_are_refused_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    result = hpctrain(*RUN, override, f"hydra.run.dir={tmp_path / 'bad'}")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_a_failing_health_check_stops_a_local_run_before_its_ranks_start(tmp_path: Path) -> None:
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\necho 'GPU 3 fell off the bus'\nexit 3\n")
    script.chmod(0o755)
    run = tmp_path / "run"
    result = hpctrain(*RUN, f"cluster.health_check={script}", f"hydra.run.dir={run}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "exited 3" in lines[-1] and "GPU 3 fell off the bus" in lines[-1], lines[-1]
    assert not (run / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("missing.sh", "not an absolute path"),
        ("/nonexistent/check.sh", "no such file"),
        ("PLAIN", "not executable"),
    ],
)
def test_bad_health_check_scripts_are_refused_in_one_line(tmp_path: Path, value: str, message: str) -> None:
    if value == "PLAIN":
        plain = tmp_path / "plain.sh"
        plain.write_text("#!/bin/sh\nexit 0\n")
        value = str(plain)
    result = hpctrain(*RUN, f"cluster.health_check={value}", f"hydra.run.dir={tmp_path / 'bad'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "cluster.health_check" in lines[0] and message in lines[0], lines[0]


@pytest.mark.parametrize("background", [False, True])
def test_ckpt_every_auto_chooses_and_logs_the_interval(tmp_path: Path, background: bool) -> None:
    run = tmp_path / "auto"
    # An MTBF of 3.6 s: Young/Daly's interval is a few steps of this tiny model.
    result = hpctrain(
        *RUN,
        "trainer.ckpt_every=auto",
        "cluster.mtbf_h=0.001",
        f"hydra.run.dir={run}",
        f"trainer.async_checkpoint={str(background).lower()}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run / "logs" / "rank0.log").read_text()
    assert "trainer.ckpt_every=auto: a save every" in log and "Young/Daly" in log, log[-2000:]
    # Written beside training, the second save charges the first what its write cost the steps beside it.
    assert ("(asynchronous save: stall and wait" in log) == background, log[-2000:]
    every = int(log.split("a save every ")[1].split(" ")[0])
    saved = sorted(layout.step_of(p) for p in layout.committed(run / "checkpoints"))
    assert saved[-1] == STEPS and every >= 1


@pytest.mark.parametrize(
    ("override", "message"),
    [("trainer.ckpt_every=sometimes", "trainer.ckpt_every"), ("cluster.mtbf_h=0", "cluster.mtbf_h")],
)
def test_bad_auto_interval_keys_are_refused_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    result = hpctrain(*RUN, override, f"hydra.run.dir={tmp_path / 'bad'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and message in lines[0], result.stderr
