"""How step time and memory per rank grow with model size under FSDP and DDP, beside the planner's prediction.

    python bench/cost_growth.py [--sizes 10M 40M 120M] [--steps 3] [--warmup 2] [--batch 2] [--mfu 0.45]

Two local processes (gloo on CPU, one thread each; NCCL on 2 GPUs) train the built-in GPT at each size
(``bench/gpt_sizes.py``; ``--sizes 1M`` for a smoke run; seq_len 64, untied embeddings, fp32, AdamW) under
``parallel=ddp`` and ``parallel=fsdp`` (ZeRO-3) on the same global batch. The measurement is
``bench/parallel.py``'s (its ``measure`` via ``run_rows``): median step time of the slowest rank over
``--steps`` steps after ``--warmup``, and the growth of the peak resident set (GPU: peak allocated memory)
from before the model is built, the largest rank.

The prediction is ``hpctrain.plan.estimate`` for the same config: memory per rank (the largest rank's
total: parameters, gradients, optimizer state, activations, buffers) and step time. The planner predicts
time only from ``cluster.peak_fp32_flops`` and communication only from a link bandwidth, so both are measured
first in this run, on the same 2 processes at once: peak = the median rate of an fp32 matmul per rank (the
slowest rank's), passed as ``cluster.peak_fp32_flops`` with ``cluster.achievable_mfu=--mfu`` (the planner's
default unless given); bandwidth = the bus bandwidth of an all-reduce (nccl-tests' busbw, 2(n−1)/n of the
bytes per second), passed as ``cluster.intra_node_gbps`` divided by the planner's ``COMM_EFFICIENCY`` so
that the planner's achieved bandwidth is the measured one. Prints the table (measured / predicted ratios,
and the MFU the measured step implies), then FSDP / DDP ratios per size, measured and predicted. A timing
is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from gpt_sizes import DEFAULT, SIZES, model_overrides
from parallel import Row, build_config, run_rows

from hpctrain.config.schema import Config
from hpctrain.models.flops import param_count
from hpctrain.plan.estimate import estimate
from hpctrain.plan.layout import COMM_EFFICIENCY
from hpctrain.rendezvous.env import DistEnv
from hpctrain.verify.layouts import LAYOUTS
from hpctrain.verify.local_group import run_local_group

MIB = 2**20
STRATEGIES = {"ddp": LAYOUTS["ddp"], "fsdp": LAYOUTS["fsdp zero3"]}
WORLD = 2
SEQ_LEN = 64


# ------------------------------------------------------------------------- this machine's peak and link


def probe(env: DistEnv, device: torch.device, out: str) -> None:
    """Every rank at once: fp32 matmul FLOP/s, then all-reduce bus bandwidth; rank 0 writes the slowest."""
    n = 4096 if device.type == "cuda" else 1024  # large enough to reach the BLAS's peak
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def timed(fn: Callable[[], object], repeats: int) -> float:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            dist.barrier()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    flops = 2 * n**3 / timed(lambda: torch.mm(a, b), 10)
    # 64 MiB: the size of DDP's and FSDP's large collectives here; busbw as nccl-tests define it.
    buffer = torch.ones(16 * MIB, device=device)
    nbytes = buffer.numel() * buffer.element_size()
    busbw = 2 * (env.world_size - 1) / env.world_size * nbytes / timed(lambda: dist.all_reduce(buffer), 5)
    slowest = torch.tensor([-flops, -busbw], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the max of the negatives: the slowest rank's
    if env.rank == 0:
        Path(out).write_text(json.dumps({"flops": -slowest[0].item(), "busbw": -slowest[1].item()}))
    dist.destroy_process_group()


def machine_speed() -> tuple[float, float]:
    """(FLOP/s per rank, bus bandwidth in bytes/s) of ``WORLD`` processes of this machine."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-cost-growth-") as tmp:
        out = Path(tmp) / "probe.json"
        run_local_group(probe, WORLD, str(out))
        found = json.loads(out.read_text())
    return found["flops"], found["busbw"]


# ------------------------------------------------------------------------------------------- the table


def planner_overrides(flops: float, busbw: float, mfu: float | None) -> tuple[str, ...]:
    gbps = busbw * 8 / 1e9 / COMM_EFFICIENCY
    extra = (f"cluster.achievable_mfu={mfu}",) if mfu is not None else ()
    return (f"cluster.peak_fp32_flops={flops:.6g}", f"cluster.intra_node_gbps={gbps:.6g}", *extra)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def number(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None else f"{value / scale:.{digits}f}"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT, choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (≥ 1)")
    parser.add_argument("--batch", type=int, default=2, help="global batch (samples of 64 tokens)")
    parser.add_argument("--mfu", type=float, help="cluster.achievable_mfu for the planner (default: its own)")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be ≥ 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()

    flops, busbw = machine_speed()
    planner = planner_overrides(flops, busbw, args.mfu)
    rows: list[Row] = []
    configs: dict[str, Config] = {}
    for size in args.sizes:
        for strategy, layout in STRATEGIES.items():
            row = Row(layout, (*model_overrides(size, SEQ_LEN, group=False), *planner), f"{strategy} {size}")
            rows.append(row)
            configs[row.name] = build_config(row, args.batch)
    mfu = configs[rows[0].name].cluster.achievable_mfu
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name(0)} × {WORLD}, NCCL"
    else:
        device = f"CPU ({os.cpu_count()} cores), gloo, 1 thread per rank"
    print(
        f"torch {torch.__version__} | {device} | GPT seq_len {SEQ_LEN}, untied, fp32, AdamW | global batch "
        f"{args.batch} | median of {args.steps} steps after {args.warmup} warm-up",
        flush=True,
    )
    print(
        f"measured in this run, {WORLD} ranks at once: fp32 matmul {flops / 1e9:.1f} GFLOP/s per rank -> "
        f"cluster.peak_fp32_flops (planner assumes achievable_mfu {mfu:g}); all-reduce bus bandwidth "
        f"{busbw / 1e9:.2f} GB/s -> cluster.intra_node_gbps {busbw * 8 / 1e9 / COMM_EFFICIENCY:.3g} "
        f"(× COMM_EFFICIENCY {COMM_EFFICIENCY:g} = the measured)",
        flush=True,
    )
    results = run_rows(rows, configs, {"steps": args.steps, "warmup": args.warmup})

    predicted = {name: estimate(cfg) for name, cfg in configs.items()}
    print(
        f"\n{'size':>5} {'params':>11} {'strategy':>8} | {'step s':>7} {'pred s':>7} {'ratio':>6} "
        f"{'MFU':>6} {'comm s':>7} | {'peak MiB':>9} {'pred MiB':>9} {'ratio':>6}"
    )
    for row in rows:
        size, strategy = row.name.split()[1], row.name.split()[0]
        r, est = results[row.name], predicted[row.name]
        n_params = param_count(configs[row.name].model)
        if "step_s" not in r:
            print(f"{size:>5} {n_params:>11,} {strategy:>8} | {r.get('error') or r.get('skipped')}")
            continue
        step, peak = r["step_s"], r["peak_bytes"]
        pred_step = est.time.step_s if est.time is not None else None
        pred_mem = est.largest.total
        model_flops = est.time.flops_per_step if est.time is not None else None
        achieved = f"{model_flops / (step * WORLD * flops):.1%}" if model_flops else "-"
        comm = sum(c.seconds or 0.0 for c in est.time.comms) if est.time is not None else None
        print(
            f"{size:>5} {n_params:>11,} {strategy:>8} | {step:>7.3f} {number(pred_step, 1, 3):>7} "
            f"{ratio(step, pred_step):>6} {achieved:>6} {number(comm, 1, 3):>7} | {number(peak, MIB, 1):>9} "
            f"{pred_mem / MIB:>9.1f} {ratio(peak, pred_mem):>6}"
        )
    print("\nfsdp / ddp       step measured  predicted | peak measured  predicted")
    for size in args.sizes:
        ddp, fsdp = results[f"ddp {size}"], results[f"fsdp {size}"]
        ddp_est, fsdp_est = predicted[f"ddp {size}"], predicted[f"fsdp {size}"]
        steps = (
            (fsdp_est.time.step_s, ddp_est.time.step_s)
            if fsdp_est.time is not None and ddp_est.time is not None
            else (None, None)
        )
        print(
            f"{size:>5} {'':>10} {ratio(fsdp.get('step_s'), ddp.get('step_s')):>14} "
            f"{ratio(*steps):>10} | {ratio(fsdp.get('peak_bytes'), ddp.get('peak_bytes')):>13} "
            f"{ratio(fsdp_est.largest.total, ddp_est.largest.total):>10}"
        )
    print(
        "step s: slowest rank, median; pred s: planner (compute at peak × MFU + exposed communication); "
        "MFU: model FLOPs / (step × ranks × measured peak); comm s: the planner's communication time, "
        "before what it hides behind compute"
    )
    if torch.cuda.is_available():
        print("peak MiB: growth of max_memory_allocated, largest rank; pred MiB: the planner's largest rank")
    else:
        print(
            "peak MiB: growth of the peak resident set (VmHWM) from before the model is built, largest rank; "
            "pred MiB: the planner's largest rank (no CUDA reserve on CPU)"
        )
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
