"""Does ``trainer.eval_job`` slow training? Step time with and without evaluation jobs, on the test cluster.

    SLURM_CONF=... python bench/eval_job_step.py [--rounds 2]   # against a running cluster
    python bench/eval_job_step.py                               # starts the test cluster itself (root)

Per round, two runs of the same job (``cluster=slurm_test``, one node, one task, a checkpoint every
``--every`` steps, a metrics record per step) one after the other: A without evaluation jobs, B with
``trainer.eval_job=slurm_test`` (after each committed checkpoint, rank 0 submits an evaluation job from a
background thread, ``--dependency=after:<training job>``). The training job is held to node1 and the
evaluation jobs to the other nodes, as they would run on other GPUs of a real cluster.

Printed per round: the median step time of A and of B, B/A, and B/A over B's steps during which no evaluation
job ran (Slurm's start/end of each evaluation job, from sacct). The second ratio is the mechanism's own cost
(submission from a thread, nothing waited for); the first adds what this machine adds: its nodes are
namespaces of one machine, so an evaluation job that runs takes CPU from the training beside it, which on a
real cluster it would not. A timing is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402

JOB = [
    "cluster=slurm_test",
    "cluster.nodes=1",
    "cluster.tasks_per_node=1",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.keep_last=100",
    "data.max_bytes=200000",
    "logger=jsonl",
]


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def slurm(args: list[str], env: dict[str, str]) -> str:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout


def wait_done(job_ids: list[str], env: dict[str, str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not slurm(["squeue", "--noheader", "--format=%i", "--jobs", ",".join(job_ids)], env).split():
            return
        time.sleep(1)
    raise SystemExit(f"jobs {job_ids} still queued after {timeout} s")


def intervals(job_ids: list[str], env: dict[str, str]) -> list[tuple[float, float]]:
    """(start, end) of each job as epoch seconds, from sacct."""
    out = slurm(["sacct", "-X", "-n", "-P", "--format=Start,End", "--jobs", ",".join(job_ids)], env)
    spans = []
    for line in out.splitlines():
        start, _, end = line.partition("|")
        with contextlib.suppress(ValueError):
            spans.append((datetime.fromisoformat(start).timestamp(), datetime.fromisoformat(end).timestamp()))
    return spans


def train(run: Path, extra: list[str], steps: int, every: int, env: dict[str, str]) -> list[dict]:
    overrides = [
        *JOB,
        f"trainer.max_steps={steps}",
        f"trainer.ckpt_every={every}",
        *extra,
        f"hydra.run.dir={run}",
    ]
    submitted = subprocess.run(
        [sys.executable, "-m", "hpctrain", *overrides], cwd=REPO, env=env, capture_output=True, text=True
    )
    if submitted.returncode != 0:
        raise SystemExit(f"submission failed:\n{submitted.stderr}")
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    wait_done([job_id], env, timeout=900)
    records = [r for r in metrics(run) if "step_time_s" in r and r.get("step_time_s") is not None]
    if len(records) < steps // 2:
        raise SystemExit(f"{run}: {len(records)} step records of {steps}; see {run}/logs")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs")
    parser.add_argument("--steps", type=int, default=120, help="steps per run")
    parser.add_argument(
        "--every", type=int, default=20, help="steps between checkpoints (one evaluation each)"
    )
    opts = parser.parse_args()
    with (
        environment_for_benchmarks(num_nodes=3) as env,
        tempfile.TemporaryDirectory(prefix="hpct-evalj-") as tmp,
    ):
        rows = []
        for n in range(opts.rounds):
            a = train(Path(tmp) / f"a{n}", [], opts.steps, opts.every, env)
            b_run = Path(tmp) / f"b{n}"
            b = train(b_run, ["trainer.eval_job=slurm_test"], opts.steps, opts.every, env)
            log = (b_run / "logs" / "rank0.log").read_text()
            evals = [
                line.split("Evaluation job ")[1].split()[0]
                for line in log.splitlines()
                if "Evaluation job " in line
            ]
            if evals:
                wait_done(evals, env, timeout=600)
            spans = intervals(evals, env)
            # A step record's time is when it was logged; the step ran during the step_time_s before it.
            quiet = [
                r
                for r in b
                if not any(s <= r["time"] and r["time"] - r["step_time_s"] <= e for s, e in spans)
            ]
            med_a, med_b = (statistics.median(r["step_time_s"] for r in x) for x in (a, b))
            med_q = statistics.median(r["step_time_s"] for r in quiet) if quiet else float("nan")
            rows.append((med_a, med_b, med_q, len(evals), len(quiet), len(b)))
            print(
                f"round {n + 1}: step A {med_a * 1e3:.1f} ms, B {med_b * 1e3:.1f} ms "
                f"(B/A {med_b / med_a:.3f}); "
                f"B's {len(quiet)} of {len(b)} steps with no evaluation job running {med_q * 1e3:.1f} ms "
                f"(B/A {med_q / med_a:.3f}); {len(evals)} evaluation jobs",
                flush=True,
            )
        ratios = [b / a for a, b, *_ in rows]
        quiet_ratios = [q / a for a, _, q, *_ in rows]
        print(
            f"median over {len(rows)} rounds: B/A {statistics.median(ratios):.3f} (all steps), "
            f"{statistics.median(quiet_ratios):.3f} (steps with no evaluation job running beside them)"
        )


if __name__ == "__main__":
    main()
