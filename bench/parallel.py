"""Which parallel strategy? Step time, memory and communication of every layout, on the same GPT.

    python bench/parallel.py [--steps 8] [--warmup 2] [--batch 16] [--only WORD ...]

The layouts are those of ``hpctrain.verify.layouts``. Every row trains the same model on the same global
batch of synthetic tokens, in fp32, through the real code: ``parallelize`` → ``train_step`` (forward,
backward, clipping, optimizer step; no logging, evaluation or checkpoints). Each row's micro-batch size is
derived so that the global batch is the same everywhere. Rows of one world size share one launch of that
many processes (gloo on CPU, NCCL on GPUs), as in ``hpctrain.verify.parity``; on CPU each rank runs one
thread, as each rank would drive one GPU.

Columns:
- step ms: median over the timed steps of the slowest rank's step time. Every step starts after a barrier,
  so the ranks start together. "× none" divides by the one-process reference measured in this run.
- state MiB: parameters + gradients + optimizer state held by one rank (local shards), read from the
  tensors at the optimizer step of the last warm-up step; the largest over the ranks.
- peak MiB: growth of the peak resident set size (CPU) or of the peak allocated device memory (CUDA),
  from just before the model is built to after the timed steps; the largest over the ranks.
- comm MiB: bytes sent per step per rank during the timed steps, from the loopback interface's transmit
  counter (gloo runs over TCP on 127.0.0.1, so this counts every collective, DDP's C++ reducer included).
  Not measurable with NCCL (no sockets within a node): "-".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hpctrain.checkpoint.state import seed_everything
from hpctrain.config.compose import compose, to_typed
from hpctrain.config.schema import Config
from hpctrain.config.shape import degrees, global_batch_size, samples_per_pass
from hpctrain.config.validate import validate
from hpctrain.data import GlobalBatchSampler, build_datasets, shard_for_rank, split_micro_batches
from hpctrain.models import build_model
from hpctrain.models.builtin import model_spec
from hpctrain.models.flops import param_count
from hpctrain.parallel.apply import parallelize, prime_ddp_buckets
from hpctrain.precision.amp import grad_scaler
from hpctrain.rendezvous.env import DistEnv
from hpctrain.train.optim import build_optimizer
from hpctrain.train.trainer import loss_of, train_step
from hpctrain.verify.layouts import LAYOUTS, Layout, OnLayout
from hpctrain.verify.local_group import run_local_group

MIB = 2**20
# Small enough that 8 processes on 2 CPU cores finish in a minute. Untied embeddings, as the timings were
# first taken (tied ones pipeline too, with one more all-reduce a step: Megatron's embedding group).
MODEL = [
    "model=gpt",
    "model.n_layers=4",
    "model.d_model=128",
    "model.n_heads=4",
    "model.seq_len=64",
    "model.tie_embeddings=false",
]
COMMON = ["data=synthetic", "data.num_samples=512", "trainer.precision=fp32"]


@dataclass(frozen=True)
class Row(OnLayout):
    layout: Layout
    overrides: tuple[str, ...] = ()  # on top of the layout's; trainer.micro_batch_size is derived
    name: str = ""  # the layout's name unless given


_L = LAYOUTS
ROWS = [
    Row(_L["none"]),
    Row(_L["ddp"]),
    Row(_L["ddp"], ("parallel.compression=fp16",), name="ddp + fp16 compression"),
    Row(_L["ddp"], ("parallel.compression=topk",), name="ddp + topk compression"),
    Row(_L["fsdp zero3"]),
    Row(_L["fsdp zero2"]),
    Row(_L["fsdp offload"]),
    Row(_L["fsdp zero3"], ("parallel.activation_checkpointing=full",), name="fsdp + full AC"),
    Row(_L["tp"]),
    Row(_L["tp + sp"]),
    Row(_L["pp 1f1b"]),
    Row(_L["pp gpipe"]),
    Row(_L["pp interleaved 1f1b"]),
    Row(_L["2d (fsdp 2 × tp 2)"]),
    Row(_L["hsdp (2 × 2)"]),
    Row(_L["3d (pp 2 × fsdp 2 × tp 2)"]),
]
REFERENCE = ROWS[0]


def build_config(row: Row, batch: int) -> Config:
    """The row's validated config, its micro-batch chosen so that a step is ``batch`` samples, no more
    (global = micro_batch × data-parallel size × pipeline micro-batches): no gradient accumulation."""
    cfg = to_typed(
        compose(
            [
                *MODEL,
                *COMMON,
                *row.layout.args(),
                *row.overrides,
                f"trainer.global_batch_size={batch}",
            ]
        )
    )
    d = degrees(cfg)
    per_micro_batch = d.dp * (cfg.parallel.microbatches if d.pp > 1 else 1)
    cfg.trainer.micro_batch_size = max(1, batch // per_micro_batch)
    validate(cfg)  # names the numbers if the batch does not split over this layout
    return cfg


# ---------------------------------------------------------------------------------------------- probes


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state on ``device`` (on a GPU, offloaded
    FSDP shards live in host memory and are not counted)."""
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():  # a tied weight counts once
        tensors = [p, p.grad, *optimizer.state.get(p, {}).values()]
        total += sum(
            local_bytes(t) for t in tensors if isinstance(t, torch.Tensor) and t.device.type == device.type
        )
    return total


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class PeakMemory:
    """Growth of this process's peak memory from construction on: allocated device memory on CUDA, resident
    set size on CPU (None where the peak cannot be reset)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()  # the previous layout's modules hold reference cycles (hooks)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.base: int | None = torch.cuda.memory_allocated(device)
            return
        # Rows share a process: memory the previous row freed stays in glibc's heap, where this row would
        # reuse it without the resident set growing. Hand it back to the kernel first.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            # "5" resets VmHWM (the peak resident set) to the current resident set (Linux ≥ 4.0);
            # ru_maxrss cannot be reset, so it would report the largest earlier row.
            Path("/proc/self/clear_refs").write_text("5")
            self.base = _status_kib("VmRSS") * 1024
        except (OSError, KeyError):
            self.base = None

    def growth(self) -> int | None:
        if self.base is None:
            return None
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return _status_kib("VmHWM") * 1024 - self.base


def loopback_tx_bytes() -> int | None:
    """Bytes the loopback interface has transmitted (TCP/IP headers included), or None without one."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    return None


# --------------------------------------------------------------------------------------------- workers


def measure(cfg: Config, env: DistEnv, device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    """Train ``warmup`` + ``steps`` steps of one layout; every rank returns the same measurements."""
    t = cfg.trainer
    train_set, _ = build_datasets(cfg.data, model_spec(cfg.model), t.seed)
    sampler = GlobalBatchSampler(len(train_set), global_batch_size(cfg), t.seed)
    memory = PeakMemory(device)

    # As fit() does: the same seed on every rank gives every rank the same initial weights.
    seed_everything(t.seed)
    par = parallelize(build_model(cfg.model), cfg, device)
    optimizer = build_optimizer(par.model, cfg.optim)
    scaler = grad_scaler(device, t.precision, sharded_grads=not par.whole_grads)
    first = [x.to(device) for x in train_set.get_batch([0])]
    prime_ddp_buckets(par.model, lambda model: loss_of(model(first[0]), first[1]))
    seed_everything(t.seed + 1 + env.rank)
    dp_rank, dp_size = par.data_parallel
    per_pass = samples_per_pass(cfg) // dp_size

    def one_step() -> float:
        indices = shard_for_rank(sampler.next_global_batch(), dp_rank, dp_size)
        passes = [train_set.get_batch(ix) for ix in split_micro_batches(indices, per_pass)]
        dist.barrier()  # start together: a step's time is then the slowest rank's
        start = time.perf_counter()
        train_step(par, optimizer, scaler, passes, device, t.precision, cfg.optim.grad_clip)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    # Gradients exist only between backward and zero_grad: read the state inside the optimizer step, once,
    # in the last warm-up step so that the timed steps carry no extra work.
    state_bytes = 0

    def count_state(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        nonlocal state_bytes
        state_bytes = model_state_bytes(par.model, opt, device)

    for i in range(warmup):
        hook = optimizer.register_step_post_hook(count_state) if i == warmup - 1 else None
        one_step()
        if hook is not None:
            hook.remove()

    # Loopback carries gloo's traffic only; with NCCL the counter says nothing about the collectives.
    on_loopback = dist.get_backend() == "gloo" and env.rank == 0
    dist.barrier()
    tx_start = loopback_tx_bytes() if on_loopback else None
    times = [one_step() for _ in range(steps)]
    dist.barrier()
    tx_end = loopback_tx_bytes() if on_loopback else None
    peak = memory.growth()

    # The slowest rank's time of each step, the largest state and peak over the ranks.
    stats = torch.tensor([*times, state_bytes, -1 if peak is None else peak], dtype=torch.float64)
    stats = stats.to(device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    stats = stats.cpu().tolist()
    comm = None
    if tx_start is not None and tx_end is not None:
        comm = (tx_end - tx_start) / env.world_size / steps  # every byte on lo was sent by one of the ranks
    return {
        "step_s": statistics.median(stats[:steps]),
        "state_bytes": stats[steps],
        "peak_bytes": None if stats[steps + 1] < 0 else stats[steps + 1],
        "comm_bytes": comm,
    }


def worker(
    env: DistEnv, device: torch.device, jobs: list[tuple[str, Config]], opts: dict[str, int], out: str
) -> None:
    """One rank: measure every layout of this world size in turn; rank 0 writes the results after each."""
    rank = env.rank
    # A throwaway step of the first layout first: otherwise that layout alone would carry the process's
    # one-time costs (lazy library and kernel initialisation: ~20 MiB of resident memory here) in its numbers.
    # If it fails, the measured run just below fails the same way and reports it.
    with contextlib.suppress(Exception):
        measure(jobs[0][1], env, device, warmup=1, steps=1)
    results: dict[str, dict[str, Any]] = {}
    for name, cfg in jobs:
        try:
            results[name] = measure(cfg, env, device, opts["warmup"], opts["steps"])
        except Exception as err:  # report the layout as broken and go on with the next one
            results[name] = {"error": f"rank {rank}: {type(err).__name__}: {err}".splitlines()[0]}
        if rank == 0:
            # Written after every layout: a rank that dies later (or aborts at exit) loses nothing.
            Path(out).write_text(json.dumps(results))


def run_rows(rows: list[Row], configs: dict[str, Config], opts: dict[str, int]) -> dict[str, dict[str, Any]]:
    by_world: dict[int, list[tuple[str, Config]]] = {}
    for row in rows:
        by_world.setdefault(row.ranks, []).append((row.name, configs[row.name]))
    results: dict[str, dict[str, Any]] = {}
    gpus = torch.cuda.device_count()
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-parallel-") as tmp:
        for world, jobs in sorted(by_world.items()):
            if gpus and world > gpus:
                for name, _ in jobs:
                    results[name] = {"skipped": f"needs {world} GPUs, this machine has {gpus}"}
                continue
            out = Path(tmp) / f"world{world}.json"
            start = time.perf_counter()
            launch_error = None
            try:
                run_local_group(worker, world, jobs, opts, str(out))
            except Exception as err:  # e.g. a rank aborting at exit after its work: judge by what it wrote
                launch_error = f"{type(err).__name__}: {err}".splitlines()[0]
            done = json.loads(out.read_text()) if out.exists() else {}
            for name, _ in jobs:
                results[name] = done.get(name) or {"error": f"no result (launch: {launch_error})"}
            note = f"; launch ended with {launch_error}" if launch_error else ""
            print(
                f"{world} rank(s): {len(jobs)} layout(s) in {time.perf_counter() - start:.0f} s{note}",
                file=sys.stderr,
                flush=True,
            )
    return results


# ----------------------------------------------------------------------------------------------- table


def format_table(rows: list[Row], results: dict[str, dict[str, Any]], batch: int) -> str:
    def mib(value: float | None) -> str:
        return "-" if value is None else f"{value / MIB:.2f}"

    reference = results.get(REFERENCE.name, {}).get("step_s")
    lines = [
        f"{'strategy':<27} {'ranks':>5} {'step ms':>8} {'× none':>7} {'samples/s':>9} "
        f"{'state MiB':>9} {'peak MiB':>9} {'comm MiB':>9}"
    ]
    for row in rows:
        r = results[row.name]
        if "skipped" in r:
            lines.append(f"{row.name:<27} {row.ranks:>5}  skipped: {r['skipped']}")
            continue
        if "error" in r:
            lines.append(f"{row.name:<27} {row.ranks:>5}  FAILED: {r['error']}")
            continue
        ratio = f"{r['step_s'] / reference:.2f}" if reference else "-"
        lines.append(
            f"{row.name:<27} {row.ranks:>5} {r['step_s'] * 1e3:>8.1f} {ratio:>7} {batch / r['step_s']:>9.1f} "
            f"{mib(r['state_bytes']):>9} {mib(r['peak_bytes']):>9} {mib(r['comm_bytes']):>9}"
        )
    return "\n".join(lines)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per layout")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (≥ 1)")
    parser.add_argument("--batch", type=int, default=16, help="global batch size of every layout")
    parser.add_argument("--only", nargs="*", help="run only the layouts whose name contains one of these")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be ≥ 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = [r for r in ROWS if r is REFERENCE or not args.only or any(w in r.name for w in args.only)]
    configs = {row.name: build_config(row, args.batch) for row in rows}  # a bad layout fails before launching

    started = time.perf_counter()
    model = configs[REFERENCE.name].model
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name(0)} × {torch.cuda.device_count()}, NCCL"
    else:
        device = f"CPU ({os.cpu_count()} cores), gloo, 1 thread per rank"
    print(
        f"torch {torch.__version__} | {device} | GPT {param_count(model):,} params "
        f"({model.args['n_layers']} layers, d_model {model.args['d_model']}, "
        f"seq_len {model.args['seq_len']}) | fp32 | "
        f"global batch {args.batch} | median of {args.steps} steps after {args.warmup} warm-up",
        flush=True,
    )
    results = run_rows(rows, configs, {"steps": args.steps, "warmup": args.warmup})
    print(format_table(rows, results, args.batch))
    print("state: params + grads + optimizer state per rank (local shards, largest rank)")
    if torch.cuda.is_available():
        print("peak: growth of max_memory_allocated, largest rank; comm: not measurable with NCCL")
    else:
        print("peak: growth of the peak resident set (VmHWM) from before the model is built, largest rank")
        print(
            "comm: loopback tx bytes (TCP/IP headers and one barrier per step included) / ranks / steps; "
            "it counts everything on loopback, so nothing else should be running"
        )
        print(
            "      gloo's reduce_scatter sends as much as an all-reduce: FSDP and SP rows send more than "
            "NCCL would"
        )
        cores = os.cpu_count() or 1
        if any(row.ranks > cores for row in rows):
            print(f"rows with more ranks than the {cores} cores share cores: their step times are inflated")
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
