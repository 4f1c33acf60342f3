"""Race a peer: hpctrain vs a hand-written torch DDP loop vs Lightning Fabric, same model, data and optimizer.

    python bench/race.py [--steps 200] [--window 10] [--rounds 1] [--no-fabric]
    python bench/race.py --steps 6 --window 2          # smoke run

A GPT-2-like model of bench/race_model.py (4 layers, d_model 256, 8 heads, seq 128, 512 tokens, no dropout)
on a seeded Markov-chain token set, 2 processes on CPU (gloo), global batch 32 of micro-batches of 8 per
rank (2 accumulation steps under ``no_sync``), AdamW with hpctrain's defaults (lr 1e-3, betas 0.9/0.95,
decay 0.1 on matrices, 10 warmup steps then cosine to 0.1×, clip 1.0). hpctrain trains the model as a user
would: this script writes a project folder (race_model.py, conf/model/race_gpt.yaml,
conf/data/race_markov.yaml) and runs ``python -m hpctrain --config-dir conf model=race_gpt
data=race_markov ...`` there. The rivals (bench/race_loops.py) import the same file, start their own
processes, and read the samples in hpctrain's order. Every process uses cores // 2 torch threads
(hpctrain's launcher sets OMP_NUM_THREADS so).

A step time is the wall time of ``--window`` steps divided by it: for hpctrain the gaps between its
metrics.jsonl records (logger=jsonl, trainer.log_every=window: its logging, loss all-reduce, straggler
checks are counted), for the rivals the same windows timed in their loops, which read the logged loss at the
same steps. The first window (warm-up) and the last (hpctrain evaluates there) are dropped. The three runs
alternate, ``--rounds`` times, each first in turn (an even number of rounds balances the order). Prints
each round, the median step time of each, the ratios hpctrain/raw,
hpctrain/Fabric and Fabric/raw, and the losses logged at every window and the last step: whether they are
bitwise equal to the raw loop's, else their largest absolute difference (Fabric's clip_gradients sums the
gradient norms in the optimizer's parameter order, not the model's: an ulp apart at some steps, see
race_loops.fabric_worker).

The default (200 steps, 1 round: the issue's race) takes ~10 minutes on 2 quiet cores (a step is ~1 s
there); ``--steps 60`` gives a rougher figure in ~3.
Fabric is optional (``pip install 'hpctrain[bench]'``); without it, or with ``--no-fabric``, it is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from race_loops import LoopResult, Race, run_fabric, run_raw

BENCH = Path(__file__).resolve().parent


def write_project(root: Path, race: Race) -> Path:
    """A user's project folder: the model's file and a config of the model and of the data."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "race_model.py", root / "race_model.py")
    groups = {
        "model/race_gpt": ("race_model.GPT", race.model),
        "data/race_markov": ("race_model.MarkovTokens", race.data_args()),
    }
    for name, (target, args) in groups.items():
        path = root / "conf" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join([f"_target_: {target}\n", *(f"{k}: {v}\n" for k, v in args.items())]))
    return root


def hpctrain_overrides(race: Race, model: str = "race_gpt") -> list[str]:
    """The race's numbers as hpctrain's config keys (the optimizer's are its defaults, given anyway)."""
    return [
        "--config-dir",
        "conf",
        f"model={model}",
        "data=race_markov",
        "logger=jsonl",
        f"cluster.nproc={race.nproc}",
        f"trainer.max_steps={race.steps}",
        f"trainer.log_every={race.window}",
        f"trainer.global_batch_size={race.global_batch}",
        f"trainer.micro_batch_size={race.micro_batch}",
        f"trainer.seed={race.seed}",
        f"trainer.precision={race.precision}",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.ckpt_every=0",
        f"optim.lr={race.lr}",
        f"optim.weight_decay={race.weight_decay}",
        f"optim.beta1={race.beta1}",
        f"optim.beta2={race.beta2}",
        f"optim.eps={race.eps}",
        f"optim.warmup_steps={race.warmup_steps}",
        f"optim.min_lr_ratio={race.min_lr_ratio}",
        f"optim.grad_clip={race.grad_clip}",
    ]


def run_hpctrain(
    race: Race, project: Path, run_dir: Path, model: str = "race_gpt", extra: tuple[str, ...] = ()
) -> tuple[LoopResult, list[dict[str, Any]]]:
    """Train with hpctrain in ``project``; the windows' step times, the logged losses, and every record."""
    args = [*hpctrain_overrides(race, model), *extra, f"hydra.run.dir={run_dir}"]
    cmd = [sys.executable, "-m", "hpctrain", *args]
    env = dict(os.environ)
    if race.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # hpctrain takes the GPUs it sees; the rivals would be on CPU
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"hpctrain failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Records also come at straggler checks; a window's end is a multiple of `window`.
    ends = [r for r in records if r["step"] % race.window == 0]
    times = [(b["time"] - a["time"]) / race.window for a, b in itertools.pairwise(ends)]
    losses = {
        r["step"]: r["loss"] for r in records if r["step"] % race.window == 0 or r["step"] == race.steps
    }
    # times[i] is window i + 2 (no record comes before the first); the rivals' lists start at window 1.
    return LoopResult([float("nan"), *times], losses), records


def measured(result: LoopResult) -> list[float]:
    """The windows compared: all but the first (warm-up) and the last (hpctrain evaluates in it)."""
    return result.window_times[1:-1]


def compare(name: str, losses: dict[int, float], reference: dict[int, float]) -> str:
    steps = sorted(reference)
    if [losses.get(s) for s in steps] == [reference[s] for s in steps]:
        return f"{name}: bitwise equal to raw at all {len(steps)} logged steps"
    worst = max(abs(losses[s] - reference[s]) for s in steps)
    first = next(s for s in steps if losses[s] != reference[s])
    return f"{name}: max abs diff {worst:.3g} from raw over {len(steps)} logged steps (first at step {first})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-fabric", action="store_true", help="skip Lightning Fabric")
    opts = parser.parse_args()
    if opts.steps % opts.window or opts.steps // opts.window < 3:
        parser.error("--steps must be a multiple of --window, at least 3 windows (warm-up, measured, last)")
    nproc = 2
    threads = max(1, (os.cpu_count() or 1) // nproc)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # hpctrain's launcher keeps a value it finds
    race = dataclasses.replace(Race(), steps=opts.steps, window=opts.window, nproc=nproc, threads=threads)
    fabric = not opts.no_fabric and importlib.util.find_spec("lightning") is not None
    if not fabric and not opts.no_fabric:
        print("Lightning is not installed (pip install 'hpctrain[bench]'): Fabric is skipped")
    names = ["hpctrain", "raw", *(["Fabric"] if fabric else [])]
    times: dict[str, list[float]] = {n: [] for n in names}
    last: dict[str, LoopResult] = {}
    with tempfile.TemporaryDirectory(prefix="race-") as tmp:
        project = write_project(Path(tmp) / "project", race)
        runners = {
            "hpctrain": lambda r: run_hpctrain(race, project, Path(tmp) / f"run{r}")[0],
            "raw": lambda r: run_raw(race),
            "Fabric": lambda r: run_fabric(race),
        }
        for round_ in range(opts.rounds):
            # Each goes first in turn (hpctrain, raw, Fabric; then the other way round): on this machine the
            # first run of a round was the slower one, whichever it was.
            for n in names if round_ % 2 == 0 else names[::-1]:
                last[n] = runners[n](round_)
            for n in names:
                times[n] += measured(last[n])
            line = ", ".join(f"{n} {statistics.median(measured(last[n])) * 1e3:.0f}" for n in names)
            print(f"round {round_ + 1}: {line} ms/step", flush=True)
    med = {n: statistics.median(times[n]) for n in names}
    print("median step time  " + "   ".join(f"{n} {med[n] * 1e3:.1f} ms" for n in names))
    print(f"ratio hpctrain / raw = {med['hpctrain'] / med['raw']:.3f}")
    if fabric:
        print(f"ratio hpctrain / Fabric = {med['hpctrain'] / med['Fabric']:.3f}")
        print(f"ratio Fabric / raw = {med['Fabric'] / med['raw']:.3f}")
    final = "   ".join(f"{n} {last[n].losses[race.steps]!r}" for n in names)
    print(f"final loss (step {race.steps}): {final}")
    for n in names[:1] + names[2:]:
        print(compare(n, last[n].losses, last["raw"].losses))


if __name__ == "__main__":
    main()
