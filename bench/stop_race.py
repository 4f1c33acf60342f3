"""Stop signals under CPU load: is any Ctrl-C or SIGTERM lost? (issue 29)

Starts one busy process per core (``--load``), then, ``--rounds`` times each:

- ``prepare``: ``hpctrain prepare --workers 2`` (a BPE on a few MB of text) gets SIGINT or SIGTERM to its
  process group at a random moment between its start and a few seconds later (covering the workers'
  start, their encoding and the commit). A stop sent while the command ran must end it with 130 and
  leave no output (or, in the first ~0.5 s, before the interpreter installed any handler, kill it by the
  signal's default action: nothing written either); exit 0 or an output left is a lost stop.
- ``train``: ``python -m hpctrain`` (2 processes, ``data.num_workers=1``) gets SIGINT (Ctrl-C: the
  command alone, its workers lead their own sessions) at a random moment in its first seconds. It must
  end with 130 and say how to continue; exit 0 or a failure (1) is a lost or mishandled stop.

Prints each outcome and the count of lost stops (the reference: 0). Not a timing; a stress check.

    python bench/stop_race.py [--rounds 20] [--load 2]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _busy(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _corpus(folder: Path) -> tuple[Path, Path]:
    """A few MB of the standard library's sources, and a BPE trained on a little of it."""
    text = b"".join(p.read_bytes() for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))
    big = folder / "big.txt"
    big.write_bytes(text * max(1, 6_000_000 // len(text)))
    small = folder / "small.txt"
    small.write_bytes(text[:300_000])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "prepare",
            str(small),
            "--out",
            str(folder / "bpe.bin"),
            "--tokenizer",
            "train:512",
        ],
        check=True,
        env=ENV,
        capture_output=True,
    )
    return big, folder / "bpe.tokenizer.json"


def prepare_round(folder: Path, big: Path, tokenizer: Path, sig: int, delay: float) -> str:
    out = folder / "out"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "hpctrain",
        "prepare",
        str(big),
        "--out",
        str(out / "x.bin"),
        "--tokenizer",
        str(tokenizer),
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(
        cmd, env=ENV, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(delay)
    if proc.poll() is not None:
        return "done before the stop (not counted)"
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=120)
    if proc.returncode == 130 and not out.exists():
        return "stopped"
    if (
        proc.returncode == -sig and not out.exists()
    ):  # before Python installed any handler: its default action
        return "stopped by the signal's default action (nothing written)"
    return f"LOST: exit {proc.returncode}, output {'left' if out.exists() else 'none'}"


def train_round(folder: Path, delay: float) -> str:
    run = folder / "run"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "hpctrain",
        "trainer.max_steps=100000",
        "data.max_bytes=100000",
        "logger=jsonl",
        "data.num_workers=1",
        "trainer.eval_every=0",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.Popen(
        cmd, env=ENV, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay)
    if proc.poll() is not None:
        return f"ended before the stop: exit {proc.returncode} (not counted)"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    if proc.returncode == 130 and "continue with: hpctrain resume" in out + err:
        return "stopped"
    last = (err.strip().splitlines() or ["(no stderr)"])[-1]
    return f"LOST: exit {proc.returncode}: {last[:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--train-rounds", type=int, default=6)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy processes (one per core)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="hpctrain-stop-race-"))
    big, tokenizer = _corpus(folder)
    busy = _busy(args.load)
    lost = counted = 0
    try:
        mb = big.stat().st_size >> 20
        print(f"{args.load} busy process(es); prepare --workers 2 on {mb} MB, {args.rounds} stops")
        for i in range(args.rounds):
            sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
            delay = rng.uniform(0.3, 4.0)
            outcome = prepare_round(folder, big, tokenizer, sig, delay)
            counted += "not counted" not in outcome
            lost += outcome.startswith("LOST")
            print(f"  prepare {signal.Signals(sig).name} at {delay:.2f} s: {outcome}", flush=True)
        print(f"training, 2 processes, data.num_workers=1: {args.train_rounds} Ctrl-C")
        for _ in range(args.train_rounds):
            delay = rng.uniform(2.0, 25.0)
            outcome = train_round(folder, delay)
            counted += "not counted" not in outcome
            lost += outcome.startswith("LOST")
            print(f"  train SIGINT at {delay:.1f} s: {outcome}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"lost stops: {lost} of {counted} (reference: 0)")
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
