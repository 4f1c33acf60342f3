"""How long a training step waits for its batch: token data without and with DataLoader workers.

    python bench/data_wait.py [--steps 60] [--workers 2] [--nproc 2]

Writes a token file of this Python's standard library (``hpctrain prepare``, bytes), then trains the same
GPT on it (2 ranks, ``data=tokens``) twice: batches built on the training thread (``data.num_workers=0``,
the reference) and by ``--workers`` DataLoader processes per rank. Every step is logged
(``trainer.log_every=1``), so each metrics.jsonl record holds that step's ``data_wait_s`` (rank 0's time
from asking for the step's batches to having them) and ``step_time_s``. The first 5 steps (start-up) are
left out. Prints the median wait per step, its share of the step time (target < 2% with workers) and the
ratio to the reference. Then checks that a run resumed from the middle with workers logs the same losses,
bit for bit, as the uninterrupted one (the data position is part of the checkpoint).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = 5


def hpctrain(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"hpctrain {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "data_wait_s" in r]


def train(corpus: Path, run: Path, workers: int, args: argparse.Namespace, *extra: str) -> list[dict]:
    hpctrain(
        "data=tokens",
        f"data.path={corpus}",
        f"data.num_workers={workers}",
        "model.n_layers=4",
        "model.d_model=256",
        "model.n_heads=8",
        "model.seq_len=128",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=8",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "logger=jsonl",
        f"cluster.nproc={args.nproc}",
        f"hydra.run.dir={run}",
        *extra,
    )
    return records(run)


def summary(rows: list[dict]) -> tuple[float, float, float]:
    """Median wait per step, median step time, and the share of all step time spent waiting."""
    rows = rows[WARMUP:]
    waits, steps = [r["data_wait_s"] for r in rows], [r["step_time_s"] for r in rows]
    return statistics.median(waits), statistics.median(steps), sum(waits) / sum(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-data-wait-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.bin"
        started = time.perf_counter()
        hpctrain("prepare", str(Path(sysconfig.get_paths()["stdlib"]) / "email"), "--out", str(corpus))
        print(f"token file: {corpus.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - started:.1f} s")

        half = args.steps // 2
        results = {}
        for workers in (0, args.workers):
            # A checkpoint mid-way to resume from below (saved after its step's timing: not counted).
            rows = train(corpus, work / f"w{workers}", workers, args, f"trainer.ckpt_every={half}")
            results[workers] = summary(rows)
        ref_wait = results[0][0]
        print(
            f"{'data.num_workers':>16} {'wait/step ms':>12} {'step ms':>8} {'wait share':>10} {'vs ref':>7}"
        )
        for workers, (wait, step, share) in results.items():
            ratio = wait / ref_wait if ref_wait > 0 else float("nan")
            print(f"{workers:>16} {wait * 1e3:>12.2f} {step * 1e3:>8.1f} {share:>10.2%} {ratio:>7.3f}")
        share = results[args.workers][2]
        print(f"target: wait share < 2% with workers: {'met' if share < 0.02 else 'MISSED'} ({share:.2%})")

        # Resume from the middle with workers: the losses after the resume are the uninterrupted run's.
        full = work / f"w{args.workers}"
        resumed = work / "resumed"
        checkpoint = full / "checkpoints" / f"step_{half:08d}"
        rows = train(corpus, resumed, args.workers, args, f"trainer.resume={checkpoint}")
        want = {r["step"]: r["loss"] for r in records(full) if r["step"] > half}
        got = {r["step"]: r["loss"] for r in rows}
        same = got == want
        print(
            f"resume at step {half} with {args.workers} workers: losses of steps {half + 1}-{args.steps} "
            f"{'bitwise equal' if same else 'DIFFER'} to the uninterrupted run"
        )
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
