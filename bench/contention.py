"""What work on the other core costs a training step: the step of a GPT-2-small-sized model (fp32, AdamW,
one thread) alone and beside a process that loops on one kind of work, to tell which part of an
asynchronous save's work (``bench/checkpoint_stall.py``) slows the steps it runs beside.

    python bench/contention.py [--rounds 3] [--steps 3]

Beside: ``spin`` (a Python loop: CPU only, no memory traffic), ``copy`` (a 256 MiB tensor copied over and
over: memory traffic, as the staging copy), ``crc`` (CRC-32C over 256 MiB, as the writer's checksum). Per
round every case in turn, the median of ``--steps`` steps each; prints each case's steps and its median
over the rounds ÷ the median alone. A timing is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from checkpoint_stall import train_step

from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec

BESIDE = {
    "alone": None,
    "spin": "while True: pass",
    "copy": (
        "import torch\ntorch.set_num_threads(1)\n"
        "a = torch.ones(256 << 20, dtype=torch.uint8)\nb = torch.empty_like(a)\n"
        "while True: b.copy_(a)"
    ),
    "crc": "import os\nfrom crc32c import crc32c\nb = os.urandom(256 << 20)\nwhile True: crc32c(b)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = GPTSpec(n_layers=12, d_model=768, n_heads=12, vocab_size=50304, seq_len=128)
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        started = time.perf_counter()
        train_step(model, optimizer, cfg)
        return time.perf_counter() - started

    step()  # AdamW's moments made
    steps: dict[str, list[float]] = {name: [] for name in BESIDE}
    for _ in range(args.rounds):
        for name, code in BESIDE.items():
            other = subprocess.Popen([sys.executable, "-c", code]) if code else None
            try:
                if other is not None:
                    time.sleep(1.0)  # started and looping
                steps[name].append(statistics.median(step() for _ in range(args.steps)))
            finally:
                if other is not None:
                    other.kill()
                    other.wait()
    alone = statistics.median(steps["alone"])
    print(f"step of a 124M GPT on 1 thread of {torch.get_num_threads()}; median of {args.steps} per round")
    for name, values in steps.items():
        print(
            f"{name:>6}: {' '.join(f'{v:.3f}' for v in values)} s  "
            f"÷ alone {statistics.median(values) / alone:.3f}"
        )


if __name__ == "__main__":
    main()
