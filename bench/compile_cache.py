"""The first step of a resumed run with parallel.compile=true, with the compile cache of an earlier start of
the same config (a requeue) and without it (an empty cache: a node that never compiled it).

    python bench/compile_cache.py [--rounds 2] [--model gpt] [OVERRIDE ...]
    python bench/compile_cache.py --rounds 1 model.n_layers=1        # smoke run

One run trains ``--prime-steps`` steps with ``parallel.compile_cache=<a cache folder>`` and saves a
checkpoint. Then each round resumes from that checkpoint twice, in fresh run directories, one step further
(``trainer.resume=<checkpoint>``): "cold" with an empty cache folder, "warm" with the prime run's (who goes
first alternates, one process after the other; the machine's jitter is in both). Printed per start: the
first step's time (metrics' ``step_time_s``, logged every step), process start → first step logged, the
whole process, and the cache's hits and misses from the rank's log; then the medians and cold / warm.

Device: whatever hpctrain takes (CUDA when present); ``--model`` and the overrides choose the run, e.g.
``--model gpt2_124m trainer.precision=bf16 data=synthetic`` on a GPU (bench/gpu.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HITS = re.compile(r"compile cache .*: FX graph (\d+) hit\(s\), (\d+) miss\(es\), AOTAutograd (\d+) hit\(s\)")


@dataclass
class Start:
    kind: str  # cold | warm
    first_step_s: float  # the first step's own time (compile included)
    to_first_step_s: float  # process start → the first step's record
    process_s: float  # the whole process (start, build, resume, steps, save, exit)
    hits: tuple[int, int, int] | None  # FX graph hits, misses, AOTAutograd hits (from the rank's log)


def hpctrain(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"hpctrain failed ({done.returncode}): {' '.join(args)}\n{done.stderr[-3000:]}")


def common(model: str, overrides: list[str], prefix: list[str] | None = None) -> list[str]:
    """The runs' arguments: ``prefix`` (e.g. ``--config-dir conf``), the run, then ``overrides``."""
    return [
        *(prefix or []),
        f"model={model}",
        "parallel=none",
        "cluster.nproc=1",
        "parallel.compile=true",
        "logger=jsonl",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "trainer.log_every=1",
        "trainer.ckpt_every=0",
        *overrides,
    ]


def prime(work: Path, model: str, overrides: list[str], steps: int, cache: Path, cwd: Path) -> Path:
    """Train ``steps`` steps filling ``cache``; the checkpoint the measured starts resume from."""
    run = work / "prime"
    hpctrain(
        [
            *common(model, overrides),
            f"trainer.max_steps={steps}",
            f"parallel.compile_cache={cache}",
            f"hydra.run.dir={run}",
        ],
        cwd,
    )
    return run / "checkpoints" / f"step_{steps:08d}"


def resume(
    work: Path,
    name: str,
    kind: str,
    model: str,
    overrides: list[str],
    ckpt: Path,
    step: int,
    cache: Path,
    cwd: Path,
    prefix: list[str] | None = None,
) -> Start:
    """One start resuming ``ckpt`` (of step ``step``) for one more step with the cache folder ``cache``; the
    overrides must be the prime run's (a resume refuses another model or data)."""
    run = work / name
    started = time.time()
    hpctrain(
        [
            *common(model, overrides, prefix),
            f"trainer.max_steps={step + 1}",
            f"trainer.resume={ckpt}",
            f"parallel.compile_cache={cache}",
            f"hydra.run.dir={run}",
        ],
        cwd,
    )
    process_s = time.time() - started
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first = next(r for r in records if r.get("step") == step + 1)
    log = (run / "logs" / "rank0.log").read_text()
    found = HITS.search(log)
    hits = tuple(int(x) for x in found.groups()) if found else None
    return Start(kind, first["step_time_s"], first["time"] - started, process_s, hits)  # type: ignore[arg-type]


def measure(model: str, overrides: list[str], rounds: int, prime_steps: int, cwd: Path = REPO) -> list[Start]:
    """Prime a cache, then ``rounds`` × (cold, warm) resumed starts, alternating which goes first."""
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as tmp:
        work = Path(tmp)
        cache = work / "cache"
        ckpt = prime(work, model, overrides, prime_steps, cache, cwd)
        starts = []
        for r in range(rounds):
            order = ("cold", "warm") if r % 2 == 0 else ("warm", "cold")
            for kind in order:
                folder = cache if kind == "warm" else work / f"empty{r}"
                name = f"{kind}{r}"
                starts.append(resume(work, name, kind, model, overrides, ckpt, prime_steps, folder, cwd))
                print(describe(starts[-1]), flush=True)
        return starts


def describe(s: Start) -> str:
    hits = (
        f"FX graph {s.hits[0]} hit(s) / {s.hits[1]} miss(es), AOTAutograd {s.hits[2]} hit(s)"
        if s.hits
        else "?"
    )
    return (
        f"{s.kind:>4}: first step {s.first_step_s:7.2f} s, start → first step {s.to_first_step_s:7.2f} s, "
        f"process {s.process_s:7.2f} s; {hits}"
    )


def summary(starts: list[Start]) -> list[str]:
    lines = []
    medians = {}
    for kind in ("cold", "warm"):
        mine = [s for s in starts if s.kind == kind]
        medians[kind] = (
            statistics.median(s.first_step_s for s in mine),
            statistics.median(s.to_first_step_s for s in mine),
        )
        first, to_first = medians[kind]
        lines.append(
            f"{kind} cache: first step median {first:.2f} s, start → first step {to_first:.2f} s "
            f"({len(mine)} start(s))"
        )
    (cold, cold_start), (warm, warm_start) = medians["cold"], medians["warm"]
    lines.append(
        f"speed-up of the first step with the cache: cold / warm = {cold / warm:.2f}; "
        f"start → first step: {cold_start / warm_start:.2f}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--prime-steps", type=int, default=2)
    parser.add_argument(
        "overrides", nargs="*", help="more hpctrain overrides (default: data.max_bytes=200000)"
    )
    opts = parser.parse_args()
    if opts.rounds < 1 or opts.prime_steps < 1:
        parser.error("--rounds and --prime-steps must be ≥ 1")
    run = " ".join([f"model={opts.model}", *opts.overrides])
    print(f"{run}; {opts.rounds} round(s) of cold and warm resumed starts")
    overrides = ["data.max_bytes=200000", *opts.overrides]
    for line in summary(measure(opts.model, overrides, opts.rounds, opts.prime_steps)):
        print(line)


if __name__ == "__main__":
    main()
