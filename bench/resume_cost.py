"""What resuming costs: process start → first step of a resumed run vs a fresh one, and the checkpoint's load
throughput vs this disk's read bandwidth, at three sizes of the built-in GPT.

    python bench/resume_cost.py [--sizes 10M 40M 120M] [--rounds 1] [--nproc 2] [--dir /tmp]

Per size (``bench/gpt_sizes.py``; ``--sizes 1M`` for a smoke run), with ``--nproc`` local ranks (DDP, fp32,
AdamW, one sample per rank per step, synthetic tokens), all under ``--dir``:

``--rounds`` times: a fresh run of two steps, then the checkpoint's files are dropped from the page cache
(fsync, ``posix_fadvise(POSIX_FADV_DONTNEED)``) and a run resumed from the checkpoint the first fresh run
saved at its end (``trainer.resume=<step_2>``: model + AdamW moments, ~12 bytes per parameter) trains two
more. Both are timed from just before ``python -m hpctrain`` is started to the ``time`` of its first
metrics.jsonl record (``trainer.log_every=1``; that step is not the last, so no evaluation is in it). In
every round, right before the resume, the disk: a file as large as the checkpoint, of random bytes drawn
afresh (``os.urandom``: every block unlike any other; until 2026-11-27 one random block repeated, which
this VM's storage served with ``O_DIRECT`` at 1.65-1.90 GiB/s against 0.96-1.08 for random data), is
written, fsynced, dropped from the page cache the same way and read in 8 MiB blocks through the page cache
and again with ``O_DIRECT``: the faster is the disk's cold read; then read again (warm).

The resumed run's extra time is split with rank 0's log (logs/rank0.log, millisecond stamps): "Resumed
from ... files checked and loaded in X s" is the manifest's size check and the load, which reads each shard
once (``hpctrain.checkpoint.reader``: mapped, read ahead sequentially, its CRC-32C verified before any of
its bytes reach the state, the tensors built from the bytes); every rank loads the whole checkpoint (DDP
replicates it; the ranks start on different shards). Load throughput is the checkpoint's bytes over that
time (a cold read) and is compared with the disk's cold bandwidth measured in the same round. Prints per
size the medians over the rounds, then how the extra time grows with the checkpoint's size (a least-squares
line: fixed seconds + seconds per GiB). A timing is a figure, never an assertion.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpt_sizes import DEFAULT, SIZES, model_overrides

from hpctrain.config.compose import compose, to_typed
from hpctrain.models.flops import param_count
from hpctrain.rundir.checkpoints import checkpoint_name

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
BLOCK = 8 * 2**20
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) rank0 \w+ [\w.]+: (.*)$")
# The reader verifies each file's checksum as it reads it: one figure for both (hpctrain.checkpoint.reader).
RESUMED = re.compile(r"^Resumed from .*: files checked and loaded in ([\d.]+) s")


@dataclass
class Start:
    total: float  # launch → first metrics record
    launch: float  # launch → "rank 0/N on" (interpreter, imports, config, spawn, rendezvous)
    build: float  # "rank 0/N on" → "Training from step", less check and load (model, data, optimizer)
    check: float  # a separate manifest check (hpctrain before the verifying reader; 0 now)
    load: float  # check + load (resumed runs): the reader verifies each file as it reads it
    first_step: float  # "Training from step" → the first record


def run_args(size: str, nproc: int, run: Path, *extra: str) -> list[str]:
    return [
        *model_overrides(size, seq_len=64),
        "data=synthetic",
        "data.num_samples=256",
        f"cluster.nproc={nproc}",
        f"trainer.global_batch_size={nproc}",
        "trainer.micro_batch_size=1",
        "trainer.precision=fp32",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.ckpt_every=0",
        "logger=jsonl",
        f"hydra.run.dir={run}",
        *extra,
    ]


def hpctrain(args: list[str], env: dict[str, str] | None = None, ok: bool = True) -> float:
    """Run ``python -m hpctrain ARGS``; returns the wall-clock time (Unix) just before it started. ``ok``:
    a failure ends the benchmark (a run killed on purpose passes ``ok=False``)."""
    launched = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if ok and done.returncode != 0:
        sys.exit(f"hpctrain {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return launched


hpctrain_run = hpctrain  # the name bench/fast_restart.py imports (beside the hpctrain package)


def log_lines(run: Path) -> list[tuple[float, str]]:
    """(Unix time, message) of every stamped line of logs/rank0.log (local time, as logging writes it)."""
    lines = []
    for line in (run / "logs" / "rank0.log").read_text().splitlines():
        if match := STAMP.match(line):
            stamp = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
            lines.append((stamp, match[3]))
    return lines


def first(lines: list[tuple[float, str]], prefix: str) -> tuple[float, str]:
    return next((t, text) for t, text in lines if text.startswith(prefix))


def timed_start(run: Path, launched: float) -> Start:
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    lines = log_lines(run)
    rank_up, _ = first(lines, "rank 0/")
    training, _ = first(lines, "Training from step")
    check = load = 0.0
    resumed = [m for _, text in lines if (m := RESUMED.match(text))]
    if resumed:
        load = float(resumed[0][1])
    return Start(
        total=record["time"] - launched,
        launch=rank_up - launched,
        build=training - rank_up - check - load,
        check=check,
        load=load,
        first_step=record["time"] - training,
    )


def drop_from_cache(path: Path) -> None:
    """Evict ``path``'s pages from the page cache (after fsync: dirty pages are not dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(path: Path, direct: bool = False) -> float:
    """Seconds to read ``path`` in BLOCK-sized reads into one reused buffer (page-aligned, as ``O_DIRECT``
    wants)."""
    buffer = mmap.mmap(-1, BLOCK)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    start = time.perf_counter()
    try:
        while os.readv(fd, [buffer]):
            pass
        return time.perf_counter() - start
    finally:
        os.close(fd)
        buffer.close()


def disk_read(directory: Path, size: int) -> tuple[float, float]:
    """(cold, warm) read bandwidth in bytes/s of a ``size``-byte file of random bytes written in
    ``directory``; cold: the faster of a read through the page cache and one with ``O_DIRECT``, each after
    the drop."""
    path = directory / "disk-probe.bin"
    with open(path, "wb") as f:
        for _ in range(size // BLOCK):
            f.write(os.urandom(BLOCK))  # unlike any other block: storage that dedupes gains nothing
        f.write(os.urandom(size % BLOCK))
    drop_from_cache(path)
    cold = read_all(path)
    drop_from_cache(path)
    cold = min(cold, read_all(path, direct=True))
    warm = read_all(path)
    path.unlink()
    return size / cold, size / warm


def filesystem(directory: Path) -> str:
    """The type of the filesystem ``directory`` is on (the longest mount point above it)."""
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fs, *_ = line.split()
        if str(directory.resolve()).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fs
    return kind


def in_process(start: Start) -> float:
    """From rank 0 up to the first record: the part of the start the launch's noise does not reach."""
    return start.build + start.check + start.load + start.first_step


def median_start(starts: list[Start]) -> Start:
    fields = Start.__dataclass_fields__
    return Start(**{k: statistics.median(getattr(s, k) for s in starts) for k in fields})


def measure(size: str, nproc: int, rounds: int, root: Path) -> dict[str, float | Start]:
    fresh, resumed, ratios, colds, warms = [], [], [], [], []
    checkpoint: Path | None = None
    files: list[Path] = []
    nbytes = 0
    for round_ in range(rounds):
        run = root / f"fresh{round_}"
        launched = hpctrain(run_args(size, nproc, run, "trainer.max_steps=2"))
        fresh.append(timed_start(run, launched))
        if checkpoint is None:  # the first fresh run's final checkpoint is the one every round resumes
            checkpoint = run / "checkpoints" / checkpoint_name(2)
            files = [p for p in checkpoint.rglob("*") if p.is_file()]
            nbytes = sum(p.stat().st_size for p in files)
        else:
            shutil.rmtree(run)
        # The disk's cold read right before the resume's: the pair meets the same moment of a shared machine.
        cold, warm = disk_read(root, nbytes)
        colds.append(cold)
        warms.append(warm)
        for path in files:
            drop_from_cache(path)
        run = root / f"resumed{round_}"
        launched = hpctrain(run_args(size, nproc, run, "trainer.max_steps=4", f"trainer.resume={checkpoint}"))
        resumed.append(timed_start(run, launched))
        shutil.rmtree(run)
        rate = nbytes / resumed[-1].load if resumed[-1].load > 0 else float("nan")
        ratios.append(rate / cold)
        print(
            f"  {size} round {round_ + 1}: fresh {fresh[-1].total:.2f} s, resumed {resumed[-1].total:.2f} s "
            f"(checked and loaded in {resumed[-1].load:.2f} s: {rate / GIB:.2f} GiB/s; the disk's cold read "
            f"{cold / GIB:.2f} GiB/s just before: × {ratios[-1]:.2f})",
            flush=True,
        )
    return {
        "bytes": nbytes,
        "disk_cold": statistics.median(colds),
        "disk_warm": statistics.median(warms),
        "ratio": statistics.median(ratios),
        "fresh": median_start(fresh),
        "resumed": median_start(resumed),
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT, choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=1, help="fresh + resumed runs per size (median)")
    parser.add_argument("--nproc", type=int, default=2, help="local ranks (cluster.nproc)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where runs go")
    opts = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    print(
        f"{opts.nproc} local rank(s), DDP, fp32, AdamW; runs and disk probe under {opts.dir} "
        f"({filesystem(opts.dir)}); median of {opts.rounds} round(s)",
        flush=True,
    )
    results: dict[str, dict] = {}
    for size in opts.sizes:
        with tempfile.TemporaryDirectory(prefix="hpctrain-resume-cost-", dir=opts.dir) as tmp:
            results[size] = measure(size, opts.nproc, opts.rounds, Path(tmp))

    params = {s: param_count(to_typed(compose(model_overrides(s, 64))).model) for s in opts.sizes}
    print("\nprocess start -> first step (s; each column its own median over the rounds)")
    print(
        f"{'size':>5} {'params':>11} {'ckpt MiB':>9} {'run':>8} {'total':>7} | {'launch':>6} {'build':>6} "
        f"{'check':>6} {'load':>6} {'step':>6} | {'in-process':>10}"
    )
    for size, r in results.items():
        f, s = r["fresh"], r["resumed"]
        first = f"{size:>5} {params[size]:>11,} {r['bytes'] / 2**20:>9.1f}"
        for name, run in (("fresh", f), ("resumed", s)):
            print(
                f"{first if name == 'fresh' else '':>27} {name:>8} {run.total:>7.2f} | {run.launch:>6.2f} "
                f"{run.build:>6.2f} {run.check:>6.2f} {run.load:>6.2f} {run.first_step:>6.2f} | "
                f"{in_process(run):>10.2f}"
            )
        print(
            f"{'':>27} {'extra':>8} {s.total - f.total:>7.2f} | {s.launch - f.launch:>6.2f} "
            f"{s.build - f.build:>6.2f} {'':>6} {s.load:>6.2f} {s.first_step - f.first_step:>6.2f} | "
            f"{in_process(s) - in_process(f):>10.2f}   (× fresh {s.total / f.total:.2f})"
        )
    print("\ncheckpoint read vs this disk (GiB/s, medians; cold: dropped from the page cache first)")
    print(f"{'size':>5} {'disk cold':>9} {'disk warm':>9} {'check+load':>10} {'÷ disk cold':>11}")
    for size, r in results.items():
        s, nbytes = r["resumed"], r["bytes"]
        rate = nbytes / s.load if s.load > 0 else float("nan")
        print(
            f"{size:>5} {r['disk_cold'] / GIB:>9.2f} {r['disk_warm'] / GIB:>9.2f} {rate / GIB:>10.2f} "
            f"{r['ratio']:>11.2f}"
        )
    print("  ÷ disk cold: the median over the rounds of each round's ratio to the cold read just before it")
    if any(r["disk_cold"] > 0.8 * r["disk_warm"] for r in results.values()):
        print("note: a cold read about as fast as a warm one: the page cache drop may not have taken")
    if len(results) >= 2:
        gib = [r["bytes"] / GIB for r in results.values()]
        for name, values in (
            ("fresh start", [r["fresh"].total for r in results.values()]),
            ("resume extra", [in_process(r["resumed"]) - in_process(r["fresh"]) for r in results.values()]),
            ("check + load", [r["resumed"].check + r["resumed"].load for r in results.values()]),
        ):
            slope, intercept = statistics.linear_regression(gib, values)
            print(f"growth of {name:<12}: {intercept:6.2f} s + {slope:6.2f} s per GiB of checkpoint")
        print("  (resume extra: in-process, so that the launch's noise stays out of it)")
    print(
        "launch: start -> 'rank 0/N on' (interpreter, imports, config, spawn, rendezvous); build: -> "
        "'Training from step' less check and load; step: the first step and its record; in-process: "
        "build + check + load + step"
    )
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
