"""Model FLOPs utilisation of hpctrain's built-in GPT and of the hand-written DDP loop, against a peak
measured in the same run.

    python bench/mfu.py [--steps 60] [--window 10] [--dtype auto] [--nproc N]
    python bench/mfu.py --steps 6 --window 2            # smoke run

MFU = model FLOPs per second ÷ peak FLOP/s (Chowdhery et al. 2022, "PaLM", appendix B; Hoffmann et al.
2022, "Chinchilla", appendix F, adds the smaller terms: embeddings, softmax), with model FLOPs per token
6·N + 12·L·H·Q·T: N the parameters in matmuls (embedding lookups out, a tied LM head in), L layers, H heads,
Q head dimension, T sequence length (hpctrain/models/spec.py for the built-in; race_model.matmul_params for
the bench's). Recomputation is not a model FLOP.

The peak is measured first: ``--nproc`` processes (as many as training ranks), each with a rank's torch thread
count (cores // ranks, as hpctrain's launcher sets), multiply square matrices of ``--dtype`` on the ranks'
device at the same time, so they share the cores, caches and memory bandwidth as the ranks do; each keeps its
best rate over ~2 s. The peak per device is their mean (the sum ÷ ranks), and hpctrain gets it as
``cluster.peak_flops`` (bf16) or ``cluster.peak_fp32_flops`` (fp32; it logs ``mfu`` with it). Then the same
GPT (4 layers, d_model 256, 8 heads, seq 128, vocab 512; ``--layers``, ``--d-model``, ... change it) is
trained by hpctrain (built-in ``model=gpt``) and by the raw torch DDP loop of bench/race_loops.py
(race_model.GPT), micro-batches of 8, two per rank and step (global batch 32 on 2 processes), on the same
token data; a step time is the wall time of a window of steps (the first and the last window dropped) as in
bench/race.py.

Device: CUDA when available (one process per GPU, ``--dtype auto`` is bf16 autocast, the peak a bf16
matmul), else CPU (``--dtype auto`` is fp32, 2 processes). On a GPU it also prints MFU against the data-sheet
dense peak of that GPU and dtype. Prints the peak, the FLOPs per token, and per run its step time, tokens/s
and MFU (hpctrain's own logged value too), and the ratio of the two MFUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from race import measured, run_hpctrain, write_project
from race_loops import Race, run_raw
from race_model import GPT, matmul_params

from hpctrain.models.builtin import GPTSpec
from hpctrain.train.metrics import PEAK_FLOPS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def datasheet_peak(name: str, dtype: str) -> float | None:
    """The data-sheet peak of the GPU called ``name`` (the longest table key in it) for ``dtype``'s matmuls,
    else None: the trainer's own table (fp32 without tensor cores, torch's default for fp32 matmuls: no TF32;
    bf16 on tensor cores), the one its MFU uses."""
    for key in sorted(PEAK_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_FLOPS[key].get(dtype)
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_worker(
    rank: int, device_type: str, dtype: str, threads: int, size: int, seconds: float, barrier: Any, out: Any
) -> None:
    """Best FLOP/s of ``size``² matmuls over ``seconds``, started with the other processes at the barrier."""
    torch.set_num_threads(threads)
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    a = torch.randn(size, size, device=device, dtype=DTYPES[dtype])
    b = torch.randn(size, size, device=device, dtype=DTYPES[dtype])
    for _ in range(3):  # warm-up: kernel selection, clocks
        a @ b
    _sync(device)
    start = time.perf_counter()
    a @ b
    _sync(device)
    reps = max(1, int(0.2 / (time.perf_counter() - start)))  # a timed block of ~0.2 s
    barrier.wait()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = max(best, reps * 2 * size**3 / (time.perf_counter() - start))
    out.put(best)


def measure_peak(device_type: str, dtype: str, nproc: int, threads: int, size: int) -> list[float]:
    """Each process's best matmul FLOP/s, all running at once."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(nproc), ctx.Queue()
    procs = [
        ctx.Process(target=peak_worker, args=(r, device_type, dtype, threads, size, 2.0, barrier, out))
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cuda = torch.cuda.is_available()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count() if cuda else 2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per rank and step")
    parser.add_argument("--matmul", type=int, default=8192 if cuda else 1024, help="peak matmul size")
    opts = parser.parse_args()
    if opts.steps % opts.window or opts.steps // opts.window < 3:
        parser.error("--steps must be a multiple of --window, at least 3 windows (warm-up, measured, last)")
    device = "cuda" if cuda else "cpu"
    dtype = opts.dtype if opts.dtype != "auto" else ("bf16" if cuda else "fp32")
    threads = max(1, (os.cpu_count() or 1) // opts.nproc)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # hpctrain's launcher keeps a value it finds
    model = {
        "vocab_size": 512,
        "seq_len": opts.seq_len,
        "n_layers": opts.layers,
        "d_model": opts.d_model,
        "n_heads": opts.heads,
    }
    race = dataclasses.replace(
        Race(),
        steps=opts.steps,
        window=opts.window,
        nproc=opts.nproc,
        threads=threads,
        model=model,
        global_batch=opts.micro_batch * opts.accumulate * opts.nproc,
        micro_batch=opts.micro_batch,
        precision=dtype,
        device=device,
    )

    rates = measure_peak(device, dtype, opts.nproc, threads, opts.matmul)
    peak = statistics.mean(rates)
    where = torch.cuda.get_device_name(0) if cuda else f"cpu, {threads} thread(s) per process"
    print(f"device: {where}; {dtype}; {opts.nproc} process(es)")
    print(
        f"measured peak ({opts.matmul}² {dtype} matmuls, {opts.nproc} at once): {peak / 1e9:,.1f} GFLOP/s "
        f"per process (each: {', '.join(f'{r / 1e9:,.1f}' for r in rates)})"
    )
    spec = GPTSpec(**model)
    ours_flops = spec.flops_per_token()
    n_raw = matmul_params(GPT(**model))
    raw_flops = 6 * n_raw + 12 * opts.layers * opts.seq_len * opts.d_model  # 12·L·H·Q·T, H·Q = d_model
    print(
        f"FLOPs per token (6N + 12LHQT): built-in GPT {ours_flops / 1e6:.2f} M "
        f"(N {spec.param_count(include_embeddings=False):,}), bench GPT {raw_flops / 1e6:.2f} M (N {n_raw:,})"
    )

    extra = (
        *(f"model.{k}={v}" for k, v in model.items()),
        # The key of the peak the run's precision computes at (hpctrain.precision.matmul_peak).
        f"cluster.{'peak_flops' if dtype == 'bf16' else 'peak_fp32_flops'}={peak}",
    )
    with tempfile.TemporaryDirectory(prefix="mfu-") as tmp:
        project = write_project(Path(tmp) / "project", race)
        ours, records = run_hpctrain(race, project, Path(tmp) / "run", model="gpt", extra=extra)
        raw = run_raw(race)
    tokens_per_step = race.global_batch * opts.seq_len
    measured_steps = range(2 * opts.window, opts.steps, opts.window)  # the windows measured() keeps
    logged = [r["mfu"] for r in records if r["step"] in measured_steps and "mfu" in r]
    sheet = datasheet_peak(torch.cuda.get_device_name(0), dtype) if cuda else None
    results = {}
    for name, result, flops in (("hpctrain", ours, ours_flops), ("raw loop", raw, raw_flops)):
        step_s = statistics.median(measured(result))
        achieved = flops * tokens_per_step / step_s / opts.nproc  # model FLOP/s per device
        results[name] = achieved / peak
        line = (
            f"{name:>8}: {step_s * 1e3:8.1f} ms/step, {tokens_per_step / step_s:10,.0f} tokens/s, "
            f"MFU {achieved / peak:.3f} of the measured peak"
        )
        if sheet:
            line += f", {achieved / sheet:.4f} of the data sheet's {sheet / 1e12:g} TFLOP/s"
        if name == "hpctrain" and logged:
            line += f" (hpctrain's own metrics: {statistics.median(logged):.3f})"
        print(line)
    if cuda and not sheet:
        print(f"no data-sheet peak known for {torch.cuda.get_device_name(0)} in {dtype}")
    print(f"ratio MFU hpctrain / raw = {results['hpctrain'] / results['raw loop']:.3f}")


if __name__ == "__main__":
    main()
