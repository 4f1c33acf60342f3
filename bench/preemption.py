"""What a pre-emption costs on the test cluster: time from the signal to training again, and steps lost.

    SLURM_CONF=... python bench/preemption.py [--runs 3]     # against a running cluster
    python bench/preemption.py                                # starts the test cluster itself (root)

Submits ONE long job (``cluster=slurm_test``, 2 nodes x 2 tasks, ``trainer.max_steps=100000``, a metrics
record every step, no periodic checkpoints) and pre-empts it ``--runs`` times with ``scancel --signal=USR2``:
every rank saves at the next step boundary, rank 0 requeues the job, the requeued job resumes. Per
pre-emption it measures

- signal -> first step: from the return of ``scancel`` to the ``time`` of the first metrics.jsonl record of
  the resumed job, broken down into signal -> checkpoint saved (the "Stopped by" line of logs/rank0.log),
  saved -> rank 0's "requeueing job" line (it first checks the job was not cancelled), that -> Slurm
  RUNNING again (``squeue``, polled every ``--poll`` s), RUNNING -> "rank 0/N on" (process start, imports,
  rendezvous) and that -> first step (checkpoint load, the step itself);
- steps lost: the step it stopped at minus the step the requeued job resumes from, and the last metrics
  record before the resume (it must be the stop step).

At the end the job is cancelled and metrics.jsonl must hold every step exactly once. Prints the medians,
the Slurm settings that set the latency (from slurm.conf) and the targets (<= 20 s signal -> first step,
0 steps lost). A timing is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402

JOB = [
    "cluster=slurm_test",
    "trainer.max_steps=100000",
    "trainer.log_every=1",
    "trainer.ckpt_every=0",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "data.max_bytes=200000",
    "logger=jsonl",
]
TARGET_S = 20.0
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) rank0 \w+ [\w.]+: (.*)$")


@dataclass
class Preemption:
    stop_step: int
    resume_step: int
    last_logged_before: int  # the last metrics record before the resumed job's first
    first_step_after: int
    to_saved: float
    to_requeue: float  # saved -> rank 0's "requeueing job" line (its check that the job was not cancelled)
    to_running: float  # that line -> squeue says RUNNING again
    to_rank_up: float  # RUNNING -> "rank 0/N on"
    to_first_step: float  # "rank 0/N on" -> the first metrics record
    total: float  # scancel returned -> the first metrics record
    pending: list[str]  # "STATE (reason) seconds" squeue showed between the stop and RUNNING


def slurm_settings(conf: Path) -> dict[str, str]:
    found = {"cred_expire": "(default 120)", "SchedulerParameters": "(default)", "KillWait": "(default 30)"}
    for line in conf.read_text().splitlines():
        key, _, value = line.split("#")[0].strip().partition("=")
        if key == "AuthInfo":
            for item in value.split(","):
                if item.startswith("cred_expire="):
                    found["cred_expire"] = item.partition("=")[2]
        elif key in ("SchedulerParameters", "KillWait"):
            found[key] = value
    return found


def log_lines(run: Path) -> list[tuple[float, str]]:
    """(Unix time, message) of every stamped line of logs/rank0.log."""
    path = run / "logs" / "rank0.log"
    lines = []
    for line in path.read_text().splitlines() if path.exists() else []:
        match = STAMP.match(line)
        if match:
            stamp = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
            lines.append((stamp, match[3]))
    return lines


def nth(lines: list[tuple[float, str]], pattern: str, n: int) -> tuple[float, re.Match[str]] | None:
    """The n-th (0-based) line whose message matches ``pattern``."""
    hits = [(t, m) for t, text in lines if (m := re.search(pattern, text))]
    return hits[n] if len(hits) > n else None


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            records.append(json.loads(line))
    return records


def job_state(job_id: str, env: dict[str, str]) -> str:
    """``STATE (reason)`` from squeue, ``GONE`` once the job has left the queue."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T (%r)"], env=env, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "GONE"


def ended(state: str) -> bool:
    return state.split()[0] in ("GONE", "CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL")


def wait_until(condition: Callable[[], object], what: str, timeout: float, poll: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def preempt(run: Path, job_id: str, n: int, env: dict[str, str], poll: float) -> Preemption:
    """Pre-empt the running job for the (n+1)-th time (n resumes so far) and follow it to its next step."""
    subprocess.run(["scancel", "--signal=USR2", job_id], env=env, check=True)
    signalled = time.time()
    running_again: float | None = None
    left_running = False
    seen: list[tuple[str, float]] = []  # (squeue state, when first seen)

    def first_record_after_resume() -> dict | None:
        nonlocal running_again, left_running
        state = job_state(job_id, env)
        if not state.startswith("RUNNING"):
            left_running = True
            if not seen or seen[-1][0] != state:
                seen.append((state, time.time()))
        elif left_running and running_again is None:
            running_again = time.time()
        started = nth(log_lines(run), r"^Training from step", n + 1)
        if started is None:
            return None
        return next((r for r in metrics(run) if r["time"] >= started[0]), None)

    wait_until(first_record_after_resume, f"requeue {n + 1} to train", timeout=300, poll=poll)
    first = first_record_after_resume()
    assert first is not None
    lines = log_lines(run)
    stopped = nth(lines, r"^Stopped by SIGUSR2 after step (\d+)", n)
    requeued = nth(lines, r"^Stopped by SIGUSR2 at step \d+ \(checkpoint saved\); requeueing job", n)
    resumed = nth(lines, r"^Resumed from \S+ \(step (\d+)\)", n)
    rank_up = nth(lines, r"^rank 0/\d+ on", n + 1)
    started = nth(lines, r"^Training from step", n + 1)
    found = {"stopped": stopped, "requeued": requeued, "resumed": resumed, "up": rank_up, "started": started}
    missing = [name for name, line in found.items() if not line]
    assert not missing, f"rank0.log lacks the {', '.join(missing)} line(s) of pre-emption {n + 1}"
    before = [r["step"] for r in metrics(run) if r["time"] < started[0]]
    if running_again is None:  # the job was back before a poll saw it leave RUNNING
        running_again = rank_up[0]
    return Preemption(
        stop_step=int(stopped[1][1]),
        resume_step=int(resumed[1][1]),
        last_logged_before=before[-1] if before else 0,
        first_step_after=first["step"],
        to_saved=stopped[0] - signalled,
        to_requeue=requeued[0] - stopped[0],
        to_running=running_again - requeued[0],
        to_rank_up=rank_up[0] - running_again,
        to_first_step=first["time"] - rank_up[0],
        total=first["time"] - signalled,
        pending=[
            f"{state} {until - since:.1f} s"
            for (state, since), until in zip(seen, [t for _, t in seen[1:]] + [running_again], strict=True)
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="pre-emptions of the one job")
    parser.add_argument("--steps-between", type=int, default=5, help="steps trained before each signal")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between looks at squeue and files")
    parser.add_argument("--dir", type=Path, help="run directory (kept); default a temporary one (removed)")
    opts = parser.parse_args()

    with environment_for_benchmarks() as env, contextlib.ExitStack() as stack:
        run = opts.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hpct-preempt-")))
        run = run.resolve() / "run"
        overrides = [*JOB, f"cluster.max_requeues={opts.runs + 1}", f"hydra.run.dir={run}"]
        submitted = subprocess.run(
            [sys.executable, "-m", "hpctrain", *overrides], cwd=REPO, env=env, capture_output=True, text=True
        )
        if submitted.returncode != 0:
            sys.exit(f"submission failed:\n{submitted.stderr}")
        sys.path.insert(0, str(REPO))
        from hpctrain.rundir.records import read_job

        record = read_job(run)
        assert record is not None
        job_id = record.job_id
        results: list[Preemption] = []
        try:
            wait_until(lambda: metrics(run), "the first step", timeout=300, poll=opts.poll)
            cold = metrics(run)[0]["time"] - record.submitted_at
            for n in range(opts.runs):
                since = results[-1].first_step_after if results else 1
                wait_until(
                    lambda since=since: (m := metrics(run)) and m[-1]["step"] >= since + opts.steps_between,
                    f"segment {n} to train {opts.steps_between} steps",
                    timeout=300,
                    poll=opts.poll,
                )
                results.append(preempt(run, job_id, n, env, opts.poll))
                r = results[-1]
                print(
                    f"pre-emption {n + 1}: stop after step {r.stop_step}, resume from {r.resume_step}, "
                    f"first step {r.first_step_after} {r.total:.2f} s after the signal",
                    flush=True,
                )
        finally:
            subprocess.run(["scancel", job_id], env=env, check=False)
        wait_until(lambda: ended(job_state(job_id, env)), "the cancelled job to end", timeout=120, poll=1)
        steps = [r["step"] for r in metrics(run)]
        settings = slurm_settings(Path(env["SLURM_CONF"]))  # before the test cluster is gone

    print(
        f"\njob {job_id}: {record.nodes} nodes x {record.tasks_per_node} tasks, {opts.runs} pre-emptions; "
        f"cold start (submission -> step 1) {cold:.2f} s"
    )
    print(
        f"Slurm ({env['SLURM_CONF']}): AuthInfo cred_expire={settings['cred_expire']}, "
        f"SchedulerParameters={settings['SchedulerParameters']}, KillWait={settings['KillWait']}"
    )
    rows = [
        ("signal -> checkpoint saved", [r.to_saved for r in results]),
        ("saved -> 'requeueing job' (cancelled? check)", [r.to_requeue for r in results]),
        ("requeue -> Slurm RUNNING again (squeue)", [r.to_running for r in results]),
        ("RUNNING -> 'rank 0/N on' (start, rendezvous)", [r.to_rank_up for r in results]),
        ("'rank 0/N on' -> first step (load, step)", [r.to_first_step for r in results]),
        ("signal -> first step of the requeued job", [r.total for r in results]),
    ]
    for name, times in rows:
        print(
            f"  {name:46s} median {statistics.median(times):6.2f} s",
            f"(runs: {', '.join(f'{t:.2f}' for t in times)})",
        )
    for n, r in enumerate(results, 1):
        print(f"  squeue from stop to RUNNING, pre-emption {n}: {' -> '.join(r.pending) or '(not seen)'}")
    lost = [r.stop_step - r.resume_step for r in results]
    print(
        f"  {'steps lost (stop step - resume step)':46s} median {statistics.median(lost):6g}   (runs: {lost})"
    )
    gaps = [
        r for r in results if r.last_logged_before != r.stop_step or r.first_step_after != r.stop_step + 1
    ]
    for r in gaps:
        print(
            f"  ! around stop step {r.stop_step}: last record before the resume {r.last_logged_before}, "
            f"first after {r.first_step_after}"
        )
    duplicated = len(steps) - len(set(steps))
    missing = sorted(set(range(1, max(steps) + 1)) - set(steps)) if steps else []
    print(
        f"  metrics.jsonl: steps 1..{max(steps, default=0)}, {len(steps)} records, {duplicated} duplicated, "
        f"{len(missing)} missing{f' {missing[:10]}' if missing else ''}"
    )
    print(
        f"targets: signal -> first step <= {TARGET_S:.0f} s (median {statistics.median(rows[-1][1]):.2f} s); "
        f"0 steps lost (max {max(lost)}); no step duplicated or missing ({duplicated} / {len(missing)})"
    )


if __name__ == "__main__":
    main()
