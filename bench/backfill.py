"""What flexible walltime (``cluster.time_min``) buys on a busy test cluster: submission → first step, against
the same run with a fixed ``cluster.time`` submitted at the same moment.

    SLURM_CONF=... python bench/backfill.py [--runs 3]     # against a running 3-node cluster
    python bench/backfill.py                                # starts the test cluster itself (root, 3 nodes)

Each round makes the queue a backfill scheduler sees on a busy machine: node1 and node2 run a job with a
2-minute limit (it ends after ``--busy`` s), and a 3-node job waits for them; node3 is idle until that job's
reserved start, a gap shorter than either run's ``cluster.time=60``. Then two 1-node runs are submitted
together, ``cluster.time_min=1`` and without it. Slurm's backfill may start the first in the gap with a
limit it grants (between the two); the second can only start after the 3-node job. Per round it prints each
run's submission → first metrics record and the limit Slurm granted the first. Both runs are cancelled at
the end of the round. A timing is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpctrain.rundir import RunDir  # noqa: E402
from hpctrain.rundir.records import read_job  # noqa: E402
from hpctrain.slurm import commands  # noqa: E402
from tests.slurm.cluster import environment_for_benchmarks  # noqa: E402

RUN = [
    "cluster=slurm_test",
    "cluster.nodes=1",
    "cluster.exclusive=true",
    "cluster.time=60",
    "cluster.signal_lead_s=30",
    "cluster.max_requeues=20",
    "trainer.max_steps=1000000",
    "trainer.log_every=1",
    "trainer.ckpt_every=0",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "data.max_bytes=200000",
    "logger=jsonl",
]


def sbatch(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def field(job_id: str, name: str) -> str:
    return commands.job_fields(job_id).get(name, "")  # main() exported the cluster's SLURM_CONF


def first_step_time(run: Path) -> float | None:
    first = RunDir(run).first_metric()
    return float(first["time"]) if first is not None and "time" in first else None


def submit(env: dict[str, str], run: Path, *extra: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain", *RUN, *extra, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"submission failed:\n{result.stderr}")
    record = read_job(run)
    assert record is not None
    return record.job_id


def one_round(env: dict[str, str], where: Path, busy_s: int, timeout: float) -> dict[str, float | str]:
    blocker = sbatch(
        env, "--nodelist=node1,node2", "--nodes=2", "--exclusive", "--time=2", f"--wrap=sleep {busy_s}"
    )
    deadline = time.monotonic() + 60
    while field(blocker, "JobState") != "RUNNING":
        if time.monotonic() > deadline:
            sys.exit("the blocking job did not start")
        time.sleep(0.2)
    waiting = sbatch(env, "--nodes=3", "--exclusive", "--time=1", "--wrap=sleep 1")
    flexible, fixed = where / "time_min", where / "fixed"
    submitted = time.time()
    jobs = {"time_min": submit(env, flexible, "cluster.time_min=1"), "fixed": submit(env, fixed)}
    granted = ""
    firsts: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(firsts) < 2 and time.monotonic() < deadline:
        for name, run in (("time_min", flexible), ("fixed", fixed)):
            first = first_step_time(run)
            if name not in firsts and first is not None:
                firsts[name] = first - submitted
        if not granted and field(jobs["time_min"], "JobState") == "RUNNING":
            granted = field(jobs["time_min"], "TimeLimit")
        time.sleep(0.2)
    subprocess.run(["scancel", *jobs.values(), blocker, waiting], env=env, check=False)
    if len(firsts) < 2:
        sys.exit(f"no first step within {timeout} s: {firsts}")
    return {**firsts, "granted": granted}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds")
    parser.add_argument("--busy", type=int, default=30, help="seconds the 2-node job holds node1 and node2")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a round may take")
    opts = parser.parse_args()
    rounds = []
    with (
        environment_for_benchmarks(num_nodes=3) as env,
        tempfile.TemporaryDirectory(prefix="hpct-bf-") as tmp,
    ):
        os.environ.update(env)  # this process's Slurm clients (commands.job_fields) reach the same cluster
        for n in range(opts.runs):
            where = Path(tmp) / str(n)
            where.mkdir()
            result = one_round(env, where, opts.busy, opts.timeout)
            rounds.append(result)
            print(
                f"round {n + 1}: submission → first step: cluster.time_min=1 {result['time_min']:.1f} s "
                f"(granted {result['granted'] or '?'}), fixed cluster.time=60 {result['fixed']:.1f} s"
            )
            time.sleep(3)  # the cancelled jobs leave their nodes
    flexible = statistics.median(float(r["time_min"]) for r in rounds)
    fixed = statistics.median(float(r["fixed"]) for r in rounds)
    print(
        f"median submission → first step: time_min {flexible:.1f} s, fixed {fixed:.1f} s: "
        f"{flexible / fixed:.2f} × (a 2-node job holds its nodes {opts.busy} s; a 3-node job waits for them)"
    )


if __name__ == "__main__":
    main()
