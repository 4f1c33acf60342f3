"""Training time an asynchronous checkpoint costs, against a synchronous save of the same state, same run;
and a synchronous save's write rate against the disk's.

    python bench/checkpoint_stall.py [--layers 12] [--d-model 768] [--steps 24] [--rounds 2] [--threads 1]
    python bench/checkpoint_stall.py --saves 20 [--plain 4] [--threads 1]

One training process, a GPT-2-small-sized model (~124M parameters, fp32) with AdamW state (model + 2
moments, 1.4 GiB in all), saved by ``CheckpointManager`` under ``--dir``. ``--threads`` is how many cores the
training steps use: 1 leaves the other core of a 2-core machine to the writer process; 2 (or the machine's
count) keeps every core busy. Per round, in this order:

- the disk: the checkpoint's size written sequentially with ``O_DIRECT`` + fsync (what a save could reach);
- ``--steps`` training steps with no checkpoint (the reference);
- the same number of steps with one asynchronous save after the first, as hpctrain's trainer does it: the
  state is staged into shared memory (the weights and optimizer state beside the next step, whose
  ``optimizer.step()`` waits for the copy) and the writer process writes it (``poll()`` every step commits it
  once written, ``wait()`` at the end). **Time lost** = the wall time of these steps, the save and the wait
  included, minus the reference's: the stall, the slowdown of every step the write ran beside, any wait;
- a synchronous save (write, fsync, checksum, commit) of the same state: the figure the loss is a share of
  (target ≤ 0.05), and a write rate (the checkpoint's bytes over its time) to set against the disk's of the
  same round (target ≥ 0.8).

The CPU time each window used in this process is printed too (the writer's is in its own process), and
the training thread's own CPU time (``time.thread_time``): its increase is the work the save put on the
training thread, a figure the load of other processes on a shared machine does not reach. A
warm-up round is not counted (the first save maps the staging segment into the writer). Prints each round,
the medians and the ratios. A timing is a figure, never an assertion.

``--saves N`` measures the time lost step by step instead, for a machine whose speed drifts from one window
to the next (on this VM the same 4 steps took 7.5-9.7 s from window to window, 0.73 s of jitter per window
against a 1.3 s sync save: the windows cannot resolve 5 % of it). One run of steps, each timed; cycles of
``--plain`` steps without a save, a save (asynchronous, or every third one synchronous: the reference), the
steps until it is written. Per asynchronous save: **lost** = the stall + the excess of every step the write
overlapped (the step it finished in included) over the median of the ``--plain`` steps before and after it
(its own neighbours: the drift cancels), + any wait. The same estimate at a cycle with no save at all
(a **placebo**, same number of overlapped steps) shows what the estimator reads where nothing was lost: its
spread is this measurement's own noise, its median its bias.
"""

from __future__ import annotations

import argparse
import logging
import mmap
import os
import resource
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


def cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system (the kernel's share of a write is system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def disk_write(path: Path, size: int, direct: bool) -> tuple[float, float]:
    """(wall s, CPU s) of writing ``size`` bytes sequentially to ``path`` in 16 MiB writes, then fsync."""
    chunk = 16 << 20
    count = -(-size // chunk)
    # Random bytes drawn afresh, every block unlike any other, made before the clock starts: this VM's
    # storage reads a file of one block repeated twice as fast as random data (bench/resume_cost.py), so a
    # repeated block (this probe's until 2026-11-27) may flatter the disk's writes too.
    buffer = mmap.mmap(-1, count * chunk)  # page-aligned, as O_DIRECT needs
    for i in range(count):
        buffer[i * chunk : (i + 1) * chunk] = os.urandom(chunk)
    view = memoryview(buffer)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    start, cpu = time.perf_counter(), cpu_seconds()
    fd = os.open(path, flags, 0o644)
    try:
        for i in range(count):
            os.write(fd, view[i * chunk : (i + 1) * chunk])
        os.fsync(fd)
    finally:
        os.close(fd)
    wall, used = time.perf_counter() - start, cpu_seconds() - cpu
    path.unlink()
    view.release()
    buffer.close()
    return wall, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=24, help="steps per window (the write must fit in them)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="cores the training steps use")
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--saves", type=int, default=0, help="asynchronous saves timed step by step")
    parser.add_argument("--plain", type=int, default=4, help="steps without a save between two saves")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)

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
        f"model: {params / 1e6:.1f}M parameters; model + optimizer state {state_bytes / 2**30:.2f} GiB "
        f"(fp32); training on {torch.get_num_threads()} thread(s) of {os.cpu_count()} CPUs; "
        f"{f'{args.saves} saves timed step by step' if args.saves else f'{args.steps} steps per window'}; "
        "writer process at nice 19"
    )

    root = Path(tempfile.mkdtemp(prefix="checkpoint_stall-", dir=args.dir))
    manager = CheckpointManager(root / "checkpoints", keep_last=1, rank=0)
    manager.overlap_staging([optimizer])  # as hpctrain's trainer does: weights copied beside the next step
    manager.start_writer().wait_ready()  # booted before the timings, as beside a run's first steps
    if args.saves:
        try:
            step_by_step(args, manager, model, optimizer, cfg, train, state)
            manager.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    keys = ("plain", "with", "lost", "stall", "wait", "write", "sync", "cpu", "own", "disk", "sync_rate")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    try:
        for round_ in range(args.rounds + 1):
            disk, _ = disk_write(root / "direct.bin", state_bytes, direct=True)
            start, cpu, own = time.perf_counter(), cpu_seconds(), time.thread_time()
            for _ in range(args.steps):
                train_step(model, optimizer, cfg)
                train.step += 1
            plain, plain_cpu = time.perf_counter() - start, cpu_seconds() - cpu
            plain_own = time.thread_time() - own

            start, cpu, own = time.perf_counter(), cpu_seconds(), time.thread_time()
            train_step(model, optimizer, cfg)
            train.step += 1
            saved = time.perf_counter()
            manager.save(train.step, state, blocking=False)
            stall = time.perf_counter() - saved
            write_end = None
            for _ in range(args.steps - 1):
                train_step(model, optimizer, cfg)
                train.step += 1
                manager.poll()  # as the trainer does every step: committed once written
                if write_end is None and not manager.pending:
                    write_end = time.perf_counter()
            waited = time.perf_counter()
            manager.wait()
            wait = time.perf_counter() - waited
            with_save, with_cpu = time.perf_counter() - start, cpu_seconds() - cpu
            with_own = time.thread_time() - own
            write = (write_end or time.perf_counter()) - saved  # to the end of the step it finished in

            start = time.perf_counter()
            final = manager.save(train.step, state, blocking=True)
            sync = time.perf_counter() - start
            written = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())

            lost, extra_cpu, extra_own = with_save - plain, with_cpu - plain_cpu, with_own - plain_own
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(
                f"{label:>8}: {args.steps} steps {plain:6.2f} s alone, {with_save:6.2f} s with an async save "
                f"(stall {stall:.3f} s, written within {write:5.2f} s, wait() {wait:.3f} s): "
                f"lost {lost:+.3f} s, CPU {extra_cpu:+.2f} s (training thread {extra_own:+.3f} s) | "
                f"sync save {sync:.3f} s "
                f"({written / sync / 2**30:.2f} GiB/s; the disk {state_bytes / disk / 2**30:.2f} GiB/s)",
                flush=True,
            )
            if round_ > 0:
                values = (
                    plain,
                    with_save,
                    lost,
                    stall,
                    wait,
                    write,
                    sync,
                    extra_cpu,
                    extra_own,
                    state_bytes / disk,
                    written / sync,
                )
                for key, value in zip(rows, values, strict=True):
                    rows[key].append(value)
        manager.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rows.items()}
    gib = state_bytes / 2**30
    print(f"median of {args.rounds} rounds:")
    print(f"  synchronous save {med['sync']:.3f} s ({med['sync_rate'] / 2**30:.2f} GiB/s, the reference)")
    print(
        f"  asynchronous: stall {med['stall']:.3f} s, written within {med['write']:.2f} s "
        f"({gib / med['write']:.2f} GiB/s beside training), wait() at the end {med['wait']:.3f} s"
    )
    print(f"  {args.steps} steps: {med['plain']:.2f} s alone, {med['with']:.2f} s with the async save")
    print(f"stall / sync save: {med['stall'] / med['sync']:.3f}")
    print(f"time lost / sync save: {med['lost'] / med['sync']:.3f} (target <= 0.05)")
    print(
        f"CPU the async save added in the training process: {med['cpu']:.2f} s, on the training thread "
        f"itself {med['own']:.3f} s = {med['own'] / med['sync']:.3f} of the sync save (the steps' own wall "
        f"jitter is {statistics.pstdev(rows['plain']):.2f} s per window here; the thread's CPU time is what "
        f"other processes' load does not reach)"
    )
    paired = statistics.median(r / d for r, d in zip(rows["sync_rate"], rows["disk"], strict=True))
    print(
        f"sync save write rate / disk O_DIRECT write: {med['sync_rate'] / 2**30:.2f} / "
        f"{med['disk'] / 2**30:.2f} GiB/s; median of each round's pair {paired:.2f} (target >= 0.8)"
    )


def step_by_step(
    args: argparse.Namespace,
    manager: CheckpointManager,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: GPTConfig,
    train: TrainState,
    state: dict,
) -> None:
    """``--saves``: the time lost per asynchronous save against its neighbouring steps (module docstring)."""
    times: list[float] = []  # every step's wall time, the save's stall in the step it followed

    def step() -> None:
        started = time.perf_counter()
        train_step(model, optimizer, cfg)
        train.step += 1
        manager.poll()  # as the trainer does every step: committed once written
        times.append(time.perf_counter() - started)

    def plain() -> None:
        for _ in range(args.plain):
            step()

    # (kind, first overlapped step, end of overlapped steps, stall + wait); kind: async | placebo
    events: list[tuple[str, int, int, float]] = []
    syncs: list[float] = []
    for _ in range(2):  # warm-up: the writer maps the staging segment at its first save
        step()
        manager.save(train.step, state, blocking=False)
        manager.wait()
    plain()
    overlapped: list[int] = []
    cycle = 0
    kinds = [kind for kind, *_ in events]
    while kinds.count("async") < args.saves or "placebo" not in kinds or not syncs:
        cycle += 1
        if cycle % 3 == 0:  # the reference, in the same run: a synchronous save of the same state
            started = time.perf_counter()
            manager.save(train.step, state, blocking=True)
            syncs.append(time.perf_counter() - started)
            plain()
            continue
        placebo = cycle % 3 == 2
        first = len(times)
        started = time.perf_counter()
        if not placebo:
            manager.save(train.step, state, blocking=False)
        stall = time.perf_counter() - started
        if placebo:  # as many steps as the median save overlapped
            for _ in range(int(statistics.median(overlapped)) if overlapped else 2):
                step()
        else:
            while manager.pending:
                step()
            overlapped.append(len(times) - first)
        waited = time.perf_counter()
        manager.wait()
        extra = stall + time.perf_counter() - waited
        events.append(("placebo" if placebo else "async", first, len(times), extra))
        kinds.append(events[-1][0])
        plain()
    lost: dict[str, list[float]] = {"async": [], "placebo": []}
    for kind, first, end, extra in events:
        around = times[first - args.plain : first] + times[end : end + args.plain]
        base = statistics.median(around)
        lost[kind].append(extra + sum(t - base for t in times[first:end]))
    sync = statistics.median(syncs)
    step_s = statistics.median(times)
    print(
        f"{len(times)} steps (median {step_s:.3f} s); {len(lost['async'])} asynchronous saves, each beside "
        f"{statistics.median(overlapped):.0f} steps (median); {len(syncs)} synchronous saves, median "
        f"{sync:.3f} s (the reference)"
    )
    for kind, values in lost.items():
        shares = sorted(v / sync for v in values)
        quartiles = statistics.quantiles(shares, n=4) if len(shares) > 1 else shares * 3
        print(
            f"  {kind:>7}: time lost / sync save: median {statistics.median(shares):+.3f}, mean "
            f"{statistics.fmean(shares):+.3f} (quartiles {quartiles[0]:+.3f} .. {quartiles[2]:+.3f}; "
            f"each: {' '.join(f'{v:+.2f}' for v in shares)})"
        )
    print(
        f"time lost / sync save: {statistics.median(lost['async']) / sync:.3f} (target <= 0.05), against "
        f"{statistics.median(lost['placebo']) / sync:+.3f} where no save ran"
    )


if __name__ == "__main__":
    main()
