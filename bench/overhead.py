"""hpctrain's 2-rank DDP training vs the minimal hand-written torch DDP loop, same model, data and seed.

    python bench/overhead.py [--steps 60] [--window 10] [--rounds 3]

Both are measured in this run, alternating, on the same machine. A step time is the wall time of a window of
``--window`` consecutive steps divided by its length: for hpctrain, the gaps between its metrics.jsonl
records (so its logging, loss all-reduce and console output are counted); for the reference, the same
windows timed in its loop. The first window of each run (warm-up) is dropped. Prints the median step time
of each, their ratio (target ≤ 1.01), and whether the final weights are bitwise equal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp
from reference_ddp import reference_worker

from hpctrain.checkpoint.tiers import read_checkpoint
from hpctrain.launch.local import free_port

REPO = Path(__file__).resolve().parents[1]


def overrides(steps: int, window: int) -> list[str]:
    # A GPT big enough that a step is compute-bound (~0.1 s on 2 CPU cores), small enough to run in a minute.
    return [
        "model.n_layers=4",
        "model.d_model=256",
        "model.n_heads=8",
        "model.seq_len=128",
        "data.max_bytes=2000000",
        f"trainer.max_steps={steps}",
        f"trainer.log_every={window}",
        "trainer.global_batch_size=32",
        "trainer.micro_batch_size=8",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.ckpt_every=0",
        "logger=jsonl",
        "cluster.nproc=2",
    ]


def run_hpctrain(args: list[str], run_dir: Path, window: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    subprocess.run(
        [sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The last record also holds the final evaluation; its window is timed up to before the eval starts.
    stamps = [r["time"] for r in records[:-1]]
    times = [(b - a) / window for a, b in itertools.pairwise(stamps)]
    steps = records[-1]["step"]
    weights = read_checkpoint(run_dir / "checkpoints" / f"step_{steps:08d}")["model_optim"]["model"]
    return times, weights


def run_reference(args: list[str], out: Path, window: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    mp.spawn(reference_worker, args=(2, free_port("127.0.0.1"), args, str(out), window), nprocs=2)
    saved = torch.load(out)
    return saved["window_times"][1:-1], saved["weights"]


def weights_equal(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> bool:
    """Every checkpointed tensor equals the reference's bit for bit. A checkpoint holds a tied weight once
    (the LM head is saved as tok_emb.weight) where the reference's state dict lists it under both names:
    a name only the reference has must be a copy of one the checkpoint holds (tests/test_parity.py)."""
    if not set(ours) <= set(reference):
        return False
    aliases_ok = all(
        any(torch.equal(reference[extra], ours[k]) for k in ours) for extra in set(reference) - set(ours)
    )
    return aliases_ok and all(torch.equal(ours[k], reference[k]) for k in ours)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = overrides(opts.steps, opts.window)
    ours_times: list[float] = []
    ref_times: list[float] = []
    bitwise = True
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(opts.rounds):
            # Who goes first alternates: a VM's slow spells (another tenant, frequency) then fall on both.
            if round_ % 2 == 0:
                ref, ref_weights = run_reference(args, Path(tmp) / f"ref{round_}.pt", opts.window)
                ours, our_weights = run_hpctrain(args, Path(tmp) / f"run{round_}", opts.window)
            else:
                ours, our_weights = run_hpctrain(args, Path(tmp) / f"run{round_}", opts.window)
                ref, ref_weights = run_reference(args, Path(tmp) / f"ref{round_}.pt", opts.window)
            ref_times += ref
            ours_times += ours
            bitwise &= weights_equal(our_weights, ref_weights)
            print(
                f"round {round_ + 1}: hpctrain {statistics.median(ours) * 1e3:.1f} ms/step, "
                f"reference {statistics.median(ref) * 1e3:.1f} ms/step",
                flush=True,
            )
    ours_median, ref_median = statistics.median(ours_times), statistics.median(ref_times)
    print(f"median step time  hpctrain {ours_median * 1e3:.1f} ms   reference {ref_median * 1e3:.1f} ms")
    print(f"ratio hpctrain / reference = {ours_median / ref_median:.3f}   (target ≤ 1.01)")
    print(f"final weights bitwise equal: {bitwise}")


if __name__ == "__main__":
    main()
