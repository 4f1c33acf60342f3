"""``hpctrain status | logs | cancel | summary`` against the real test cluster (tests/slurm/cluster.py).

The module's two Slurm jobs are submitted together up front (2 + 1 of the cluster's 3 nodes), so that they
run side by side while the tests look at them one after the other.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.rundir import SWEEP_RECORD
from hpctrain.rundir.records import SweepMember, SweepRecord, read_job, write_json
from tests.support import REPO, hpctrain, metrics

SMALL = ["data.max_bytes=200000", "trainer.eval_batches=1", "logger=jsonl"]
INJECTED = "RuntimeError: injected failure at step 3 (faults.fail_at=1:3)"


@dataclass
class Job:
    run_dir: Path
    job_id: str


@dataclass
class Jobs:
    failing: Job  # 2 nodes × 2 tasks; rank 1 raises at step 3
    long: Job  # 1 node × 1 task, 100000 steps: cancelled by a test


def jobs_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def fields(status_output: str) -> dict[str, str]:
    """``hpctrain status``'s "key  value" lines (continuation lines, indented, left out)."""
    return dict(line.split(None, 1) for line in status_output.splitlines() if line[:1].strip())


def submit(run_dir: Path, *overrides: str) -> Job:
    result = hpctrain("cluster=slurm_test", *SMALL, *overrides, f"hydra.run.dir={run_dir}", timeout=60)
    assert result.returncode == 0, result.stderr
    record = read_job(run_dir)
    assert record is not None
    return Job(run_dir, record.job_id)


def sacct_states(job_id: str, every_attempt: bool = False) -> list[str]:
    """sacct's state of the job; with ``every_attempt``, one per run of a requeued job."""
    args = ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id, "--format", "State"]
    out = subprocess.run(
        [*args, "--duplicates"] if every_attempt else args,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sacct_state(job_id: str) -> str:
    states = sacct_states(job_id)
    return states[-1] if states else ""


@pytest.fixture(scope="module")
def jobs(slurm_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    root = tmp_path_factory.mktemp("jobs")
    failing = submit(root / "failing", "trainer.max_steps=20", "faults.fail_at=1:3")
    long = submit(
        root / "long",
        "cluster.nodes=1",
        "cluster.tasks_per_node=1",  # what is under test is status and cancel, not its ranks
        "cluster.time=00:03:00",
        "trainer.max_steps=100000",
        "trainer.log_every=5",
    )
    yield Jobs(failing, long)
    # Whatever a failed test left running.
    subprocess.run(["scancel", failing.job_id, long.job_id], capture_output=True, timeout=30)


def test_logs_follow_until_the_job_ends(jobs: Jobs) -> None:
    run = jobs.failing
    followed = jobs_cli("logs", run.run_dir, "-f", timeout=120)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert any("rank0 INFO hpctrain.worker: rank 0/4" in line for line in lines), followed.stdout
    assert all(" rank0 " in line for line in lines if line[:4].isdigit()), followed.stdout
    # -f returned by itself: the job has ended (sacct may lag a second behind squeue).
    wait_for("sacct to record the end", lambda: sacct_state(run.job_id) == "FAILED", timeout=10)

    tail = jobs_cli("logs", run.run_dir, "-n", "2")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == (run.run_dir / "logs" / "rank0.log").read_text().splitlines()[-2:]
    rank1 = jobs_cli("logs", run.run_dir, "--rank", "1", "-n", "100")
    assert rank1.returncode == 0 and "rank1 " in rank1.stdout and " rank0 " not in rank1.stdout


def test_failed_run_shows_the_cause(jobs: Jobs) -> None:
    run = jobs.failing
    wait_for("the job to fail", lambda: sacct_state(run.job_id) == "FAILED", timeout=60)
    for target in (run.run_dir, run.job_id):  # a job id finds its run directory through Slurm
        shown = jobs_cli("status", target)
        assert shown.returncode == 1, shown.stderr  # a failed run
        shown_fields = fields(shown.stdout)
        assert shown_fields["job"].startswith(f"{run.job_id} (submitit on slurm_test: 2 nodes × 2 tasks)")
        assert shown_fields["state"] == "FAILED (exit code 1:0)"
        assert shown_fields["run"] == str(run.run_dir)
        # Rank 1 raised; ranks 0, 2 and 3 only lost their peer: the error shown is rank 1's.
        assert shown_fields["error"].startswith("rank 1 on "), shown.stdout
        assert shown_fields["error"].endswith(INJECTED), shown.stdout


def test_cancel_a_running_job(jobs: Jobs) -> None:
    run = jobs.long

    def training() -> bool:
        return (run.run_dir / "metrics.jsonl").is_file() and bool(metrics(run.run_dir))

    wait_for("the long run to log a step", training, timeout=60)
    shown = jobs_cli("status", run.run_dir)
    assert shown.returncode == 0, shown.stderr
    running = fields(shown.stdout)
    assert running["state"] == "RUNNING" and running["nodes"].startswith("node")
    assert running["step"].endswith("/100000") and float(running["loss"]) > 0

    cancelled = jobs_cli("cancel", run.run_dir)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled job {run.job_id} (RUNNING on node")

    def shows_cancelled() -> bool:
        return fields(jobs_cli("status", run.run_dir).stdout)["state"] == "STOPPED (Slurm: CANCELLED)"

    wait_for("status to show CANCELLED", shows_cancelled, timeout=15, every=1)
    # The run requeues itself when SIGTERM stops it (hpctrain.resilience); cancel must keep it from that.
    time.sleep(2)
    assert sacct_states(run.job_id, every_attempt=True) == ["CANCELLED"]


def test_summary_of_a_sweep(slurm_cluster: object, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    lrs = ["0.001", "0.0003"]
    common = ["cluster.nproc=1", "parallel=none", "trainer.max_steps=5", *SMALL]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpctrain",
                *common,
                f"optim.lr={lr}",
                f"hydra.run.dir={sweep_dir / str(i)}",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, lr in enumerate(lrs)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    members = [
        SweepMember(i, [*common, f"optim.lr={lr}"], str(sweep_dir / str(i)), f"4242420_{i}")
        for i, lr in enumerate(lrs)
    ]
    # A member that has not started: no metrics yet.
    members.append(SweepMember(2, [*common, "optim.lr=0.0001"], str(sweep_dir / "2"), "4242420_2"))
    write_json(sweep_dir / SWEEP_RECORD, SweepRecord("4242420", "local", members))
    final = [metrics(sweep_dir / str(i))[-1] for i in range(2)]

    shown = jobs_cli("summary", sweep_dir)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"sweep {sweep_dir}: array job 4242420 on local, 3 members"
    assert lines[1] == f"common overrides: {' '.join(common)}"
    header = lines[2].split()
    assert header[:6] == ["index", "overrides", "job_id", "state", "step", "loss"]
    assert "best_val_loss" in header and "tokens_per_s" in header
    rows = [line.split() for line in lines[3:6]]
    for i, lr in enumerate(lrs):
        assert rows[i][:3] == [str(i), f"optim.lr={lr}", f"4242420_{i}"]
        assert rows[i][3:5] == ["5", f"{final[i]['loss']:.4f}"]  # state: unknown to Slurm, left empty
    assert rows[2] == ["2", "optim.lr=0.0001", "4242420_2"]
    assert lines[6] == f"wrote {sweep_dir / 'summary.csv'}"

    with open(sweep_dir / "summary.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["index"] for r in table] == ["0", "1", "2"]
    for i in range(2):
        assert float(table[i]["loss"]) == final[i]["loss"]
        assert float(table[i]["last_val_loss"]) == final[i]["val_loss"]
        assert table[i]["step"] == "5" and table[i]["overrides"].endswith(f"optim.lr={lrs[i]}")
    assert table[2]["loss"] == table[2]["step"] == table[2]["best_val_loss"] == ""

    # A local run's own status: its progress, and the state its directory says (it reached max_steps).
    local = jobs_cli("status", sweep_dir / "0")
    assert local.returncode == 0, local.stderr
    assert fields(local.stdout)["state"] == "COMPLETED" and fields(local.stdout)["step"] == "5/5"
    member_logs = jobs_cli("logs", sweep_dir, "--member", "1", "-n", "1")
    assert member_logs.returncode == 0 and member_logs.stdout.count("\n") == 1
    no_member = jobs_cli("logs", sweep_dir)
    assert no_member.returncode == 2
    assert (
        no_member.stderr == f"hpctrain logs: {sweep_dir} is a sweep: choose a member with --member I (0..2)\n"
    )


def test_unknown_targets(slurm_cluster: object, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for args, code, message in [
        (["status", "987654"], 1, "hpctrain status: 987654: unknown Slurm job id\n"),
        (["cancel", "987654_3"], 1, "hpctrain cancel: 987654_3: unknown Slurm job id\n"),
        (
            ["status", tmp_path / "empty"],
            1,
            f"hpctrain status: {tmp_path / 'empty'}: not a run or sweep directory "
            "(no job.json, sweep.json or metrics.jsonl)\n",
        ),
        (
            ["logs", tmp_path / "nowhere"],
            1,
            f"hpctrain logs: {tmp_path / 'nowhere'}: "
            "no such run directory, sweep directory or Slurm job id\n",
        ),
        (["summary", tmp_path / "empty"], 1, None),
        (["logs", tmp_path / "empty", "-n", "-3"], 2, "hpctrain logs: -n must be 0 or more, not -3\n"),
        (["status", "--no-such-flag"], 2, None),
    ]:
        result = jobs_cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1, result.stderr
        if message is not None:
            assert result.stderr == message
