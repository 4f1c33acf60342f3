"""How long a checkpoint stops training: synchronous save vs asynchronous save, same state, same run.

    python bench/checkpoint_stall.py [--layers 12] [--d-model 768] [--rounds 3] [--dir /tmp]

One process, a GPT-2-small-sized model (~124M parameters, fp32) with AdamW state (model + 2 moments,
1.4 GiB in all), saved by ``CheckpointManager`` under ``--dir``. Per round: a synchronous
``save(blocking=True)`` (write, commit) and a training step, then an asynchronous ``save(blocking=False)``
whose stall is the time until it returns (staging: the copy of every tensor), one training step while the
shards are written, and ``wait()``, which commits. A warm-up round is not counted (the first async save
allocates its staging buffers). Prints each round, the medians and the stall ratio (target ≤ 0.05).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.state import ModelOptimizerState, RNGState, TrainState
from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: GPTConfig) -> float:
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len + 1))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    logging.basicConfig(level=logging.WARNING)

    torch.manual_seed(0)
    cfg = GPTConfig(
        n_layers=args.layers, d_model=args.d_model, n_heads=12, vocab_size=args.vocab, seq_len=128
    )
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train = TrainState()
    train_step(model, optimizer, cfg)  # creates AdamW's moments
    train.step = 1
    state = {"model_optim": ModelOptimizerState(model, optimizer), "train": train, "rng_rank0": RNGState()}
    params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(
        t.numel() * t.element_size()
        for t in [*model.parameters(), *(v for s in optimizer.state.values() for v in s.values())]
        if isinstance(t, torch.Tensor)
    )
    print(
        f"model: {params / 1e6:.1f}M parameters; model + optimizer state {state_bytes / 2**30:.2f} GiB (fp32)"
    )

    root = Path(tempfile.mkdtemp(prefix="checkpoint_stall-", dir=args.dir))
    manager = CheckpointManager(root / "checkpoints", keep_last=1, rank=0)
    sync_s, stall_s, step_s, wait_s, plain_s = [], [], [], [], []
    try:
        for round_ in range(args.rounds + 1):
            start = time.perf_counter()
            manager.save(train.step, state, blocking=True)
            sync = time.perf_counter() - start
            start = time.perf_counter()
            train_step(model, optimizer, cfg)  # no write in flight
            train.step += 1
            plain = time.perf_counter() - start

            start = time.perf_counter()
            manager.save(train.step, state, blocking=False)
            stall = time.perf_counter() - start
            start = time.perf_counter()
            train_step(model, optimizer, cfg)  # runs while the shards are written
            train.step += 1
            step = time.perf_counter() - start
            start = time.perf_counter()
            manager.wait()
            wait = time.perf_counter() - start
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"{label:>8}: sync save {sync:6.3f} s, step {plain:6.3f} s | async: stall {stall:6.3f} s, "
                f"step during write {step:6.3f} s, then wait() {wait:6.3f} s"
            )
            if round_ > 0:
                sync_s.append(sync)
                stall_s.append(stall)
                step_s.append(step)
                wait_s.append(wait)
                plain_s.append(plain)
        manager.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    sync, stall = statistics.median(sync_s), statistics.median(stall_s)
    print(f"median of {args.rounds}: synchronous save {sync:.3f} s, asynchronous stall {stall:.3f} s")
    print(f"stall ratio async/sync: {stall / sync:.3f} (target <= 0.05)")
    alone, during = statistics.median(plain_s), statistics.median(step_s)
    print(
        f"training step: {alone:.3f} s alone, {during:.3f} s while the shards are written; "
        f"wait() after it {statistics.median(wait_s):.3f} s"
    )


if __name__ == "__main__":
    main()
