"""The whole GPU check in one command: on one CUDA GPU, every figure beside its reference measured in the
same run.

Over 400 lines: a lent GPU is minutes long, so its whole check is one prepared script that runs once: every
section beside its reference, the device's description and the one JSON of figures the docs read.

    python bench/gpu.py                           # everything (~10 minutes on one H100)
    python bench/gpu.py --only mfu,fp8            # some sections (each runs its own references)
    python bench/gpu.py --only cache,tests --json out.json
    python bench/gpu.py --cpu-dry-run             # the script on a CPU: tiny model, NOT GPU figures

Sections (``--only``; all by default):

- ``mfu``: ``model=gpt2_124m`` and ``gpt2_350m`` at seq 1024 on one GPU, ``trainer.precision=bf16``,
  ``parallel.compile=true``, ``optim.fused=true``, SDPA attention (the built-ins' only kind; flash on
  Hopper), TF32 for the float32 matmuls that remain (hpctrain.precision.allows_tf32). Tokens/s and MFU
  (6N + 12·L·H·Q·T FLOPs per token, PaLM appendix B) against the data-sheet dense bf16 peak (989 TFLOP/s
  for an H100 SXM; the H200's is the same 989, its tensor cores are the H100's) and against a bf16 matmul
  peak measured first; the reference: bench/mfu.py's raw loop (bench/race_loops.py: plain DDP of one rank,
  ``torch.compile`` of the whole model, fused AdamW, TF32) on the same data, micro-batch and steps: the
  ratio of the MFUs. The peak memory of each hpctrain run beside ``hpctrain plan``'s estimate (compiled;
  the eager check within 10% is a test of tests/gpu).
- ``fp8``: ``trainer.precision=fp8`` (torchao's float8 Linear layers) against bf16 on ``gpt2_350m``, same
  steps and data: tokens/s and their ratio, and both loss curves, step by step.
- ``cache``: the first step of a resumed ``gpt2_124m`` run (bench/compile_cache.py) with the compile cache
  of the run it resumes (a requeue) and with an empty one: cold / warm.
- ``tests``: ``python -m pytest -m gpu tests/gpu`` (NCCL group of one rank, set_device(local_rank), bf16
  autocast without a scaler and fp16 with one, pinned staging of async checkpoints, the hang watchdog
  while the host waits on the GPU, float8 layers, peak memory of gpt2_124m and gpt2_350m within 10% of the
  plan, an fp16 run with async checkpoints resumed).

Without CUDA (and without ``--cpu-dry-run``) it says so in one line and exits 1 before anything starts.
Needs hpctrain's dependencies and torchao (``pip install -e '.[float8]'``); on a machine that cannot reach
a package index, ``bench/gpu_wheels.sh`` brings them as wheels.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SECTIONS = ("mfu", "fp8", "cache", "tests")
MODELS = ("gpt2_124m", "gpt2_350m")
# Micro-batches of 1024 tokens that fit one 80 GB GPU with room (the planner: < 40 GiB in bf16).
MICRO_BATCH = {"gpt2_124m": 16, "gpt2_350m": 8, "gpt": 8}
FP8_MODEL = "gpt2_350m"  # the larger: more of its FLOPs are in layers float8 takes (hpctrain plan: 25%)
CACHE_MODEL = "gpt2_124m"


@dataclass
class Figures:
    """Everything measured, for --json."""

    device: dict[str, Any] = field(default_factory=dict)
    mfu: dict[str, Any] = field(default_factory=dict)
    fp8: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, Any] = field(default_factory=dict)


def say(text: str = "") -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------------------------- device
def describe_device(dry: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if dry:
        info["device"] = "cpu (--cpu-dry-run: NOT GPU figures)"
    else:
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=torch.cuda.get_device_name(0),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            memory_gib=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
            nccl=_version(torch.cuda.nccl.version()),
        )
    try:
        info["torchao"] = importlib.metadata.version("torchao")  # read without importing it
    except importlib.metadata.PackageNotFoundError:
        info["torchao"] = None
    return info


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Trained:
    """One training run of the race's model and data (hpctrain's or the raw loop's)."""

    step_s: float  # median seconds per step over the measured windows
    tokens_per_s: float
    mfu: float | None  # against the data-sheet peak
    mfu_measured_peak: float
    losses: dict[int, float]
    records: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None


def race_for(model: str, steps: int, window: int, dry: bool, precision: str) -> Any:
    from race_loops import Race

    from hpctrain.config.compose import compose, to_typed

    args = to_typed(compose([f"model={model}"])).model.args
    shape = {k: int(args[k]) for k in ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads")}
    micro = MICRO_BATCH[model]
    return Race(
        steps=steps,
        window=window,
        nproc=1,
        global_batch=micro,
        micro_batch=micro,
        model=shape,
        precision=precision,
        device="cpu" if dry else "cuda",
        threads=os.cpu_count() or 1,
        compile=True,
        fused=True,
        tf32=not dry,
    )


def flops_per_token(race: Any, builtin: bool) -> float:
    """6N + 12·L·H·Q·T of hpctrain's built-in GPT, or of the raw loop's (bench/race_model.py)."""
    from race_model import GPT, matmul_params

    from hpctrain.models.builtin import GPTSpec

    m = race.model
    if builtin:
        return GPTSpec(**m).flops_per_token()
    with torch.device("meta"):
        n = matmul_params(GPT(**m))
    return 6 * n + 12 * m["n_layers"] * m["seq_len"] * m["d_model"]


def train_hpctrain(
    race: Any, work: Path, name: str, model: str, extra: tuple[str, ...], peaks: Any
) -> Trained:
    from race import measured, run_hpctrain, write_project

    project = write_project(work / "project", race)
    run_dir = work / name
    result, records = run_hpctrain(race, project, run_dir, model=model, extra=("parallel=none", *extra))
    return _trained(
        race, measured(result), result.losses, flops_per_token(race, True), peaks, records, run_dir
    )


def train_raw(race: Any, peaks: Any) -> Trained:
    from race import measured
    from race_loops import run_raw

    result = run_raw(race)
    return _trained(race, measured(result), result.losses, flops_per_token(race, False), peaks, [], None)


def _trained(
    race: Any,
    windows: list[float],
    losses: dict[int, float],
    flops: float,
    peaks: Any,
    records: list[dict[str, Any]],
    run_dir: Path | None,
) -> Trained:
    step_s = statistics.median(windows)
    tokens = race.global_batch * race.model["seq_len"] / step_s
    sheet, measured_peak = peaks
    return Trained(
        step_s,
        tokens,
        flops * tokens / sheet if sheet else None,
        flops * tokens / measured_peak,
        losses,
        records,
        run_dir,
    )


def fmt_mfu(t: Trained) -> str:
    sheet = f"MFU {t.mfu:.1%} of the data sheet" if t.mfu is not None else "no data-sheet peak"
    return (
        f"{t.step_s * 1e3:8.1f} ms/step, {t.tokens_per_s:10,.0f} tokens/s, {sheet}, "
        f"{t.mfu_measured_peak:.1%} of the measured matmul peak"
    )


def peak_memory_vs_plan(trained: Trained, overrides: list[str], project: Path) -> tuple[float, float] | None:
    """(measured peak GiB, planned GiB) of an hpctrain run, from its metrics and `hpctrain plan`'s model."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.estimate import estimate

    peaks = [r["peak_mem_gib"] for r in trained.records if "peak_mem_gib" in r]
    if not peaks:
        return None
    planned = estimate(to_typed(compose(overrides, [project / "conf"]))).largest.total / 2**30
    return max(peaks), planned


# -------------------------------------------------------------------------------------------- sections
class Check:
    def __init__(self, opts: argparse.Namespace, work: Path) -> None:
        self.opts = opts
        self.dry = opts.cpu_dry_run
        self.work = work
        self.figures = Figures()
        self.bf16: dict[str, Trained] = {}  # hpctrain bf16 runs by model, reused by fp8 and cache
        self.caches: dict[str, Path] = {}
        self.peaks: tuple[float | None, float] = (None, 0.0)
        self.models = ("gpt",) if self.dry else MODELS

    def model_for(self, wanted: str) -> str:
        return "gpt" if self.dry else wanted

    def measure_peaks(self) -> None:
        from mfu import datasheet_peak, measure_peak

        device, dtype = ("cpu", "fp32") if self.dry else ("cuda", "bf16")
        threads = os.cpu_count() or 1
        measured_peak = statistics.mean(measure_peak(device, dtype, 1, threads, 1024 if self.dry else 8192))
        sheet = None if self.dry else datasheet_peak(torch.cuda.get_device_name(0), "bf16")
        self.peaks = (sheet, measured_peak)
        where = (
            "no data sheet (CPU)" if sheet is None else f"{sheet / 1e12:g} TFLOP/s dense bf16 (data sheet)"
        )
        say(f"peak: {where}; measured {dtype} matmul {measured_peak / 1e12:.4g} TFLOP/s")
        self.figures.device.update(datasheet_peak=sheet, measured_peak=measured_peak)

    def bf16_run(self, model: str) -> Trained:
        if model not in self.bf16:
            precision = "fp32" if self.dry else "bf16"
            race = race_for(model, self.opts.steps, self.opts.window, self.dry, precision)
            cache = self.work / f"cache-{model}"
            extra = ("parallel.compile=true", "optim.fused=true", f"parallel.compile_cache={cache}")
            self.bf16[model] = train_hpctrain(
                race, self.work, f"{model}-{precision}", model, extra, self.peaks
            )
            self.caches[model] = cache
        return self.bf16[model]

    def mfu(self) -> None:
        say(
            "\n== MFU: hpctrain vs the raw loop (bench/mfu.py's): one GPU, compile, fused AdamW, SDPA, "
            "TF32 =="
        )
        for model in self.models:
            precision = "fp32" if self.dry else "bf16"
            race = race_for(model, self.opts.steps, self.opts.window, self.dry, precision)
            ours = self.bf16_run(model)
            raw = train_raw(race, self.peaks)
            ratio = (
                ours.tokens_per_s
                / raw.tokens_per_s
                * flops_per_token(race, True)
                / flops_per_token(race, False)
            )
            say(f"{model} (micro-batch {race.micro_batch} × seq {race.model['seq_len']}, {precision}):")
            say(f"  hpctrain: {fmt_mfu(ours)}")
            logged = [r["mfu"] for r in ours.records if r.get("mfu") is not None]
            if logged:
                say(f"            (hpctrain's own metrics: MFU {statistics.median(logged):.1%})")
            say(f"  raw loop: {fmt_mfu(raw)}")
            say(f"  ratio MFU hpctrain / raw loop = {ratio:.3f}")
            overrides = [
                f"model={model}",
                "data=race_markov",
                "parallel=none",
                "cluster.nproc=1",
                f"trainer.precision={precision}",
                f"trainer.micro_batch_size={race.micro_batch}",
            ]
            memory = None if self.dry else peak_memory_vs_plan(ours, overrides, self.work / "project")
            if self.dry:
                say("  peak memory: not compared on a CPU (the metrics' peak there is the resident set)")
            if memory:
                say(
                    f"  peak memory {memory[0]:.2f} GiB, plan {memory[1]:.2f} GiB: ratio "
                    f"{memory[0] / memory[1]:.3f} (compiled; tests/gpu checks eager within 10%)"
                )
            self.figures.mfu[model] = {
                "hpctrain": _figure(ours),
                "raw": _figure(raw),
                "ratio": ratio,
                "peak_memory_vs_plan": memory,
            }

    def fp8(self) -> None:
        from hpctrain.precision import float8_problem
        from hpctrain.precision.amp import device_capability

        model = self.model_for(FP8_MODEL)
        say(f"\n== float8 (torchao) vs bf16: {model}, same steps and data ==")
        device = torch.device("cpu") if self.dry else torch.device("cuda", 0)
        problem = float8_problem(device_capability(device), _has("torchao"))
        if problem is not None:
            say(f"fp8: not run: {problem}")
            self.figures.fp8 = {"not_run": problem}
            return
        bf16 = self.bf16_run(model)
        race = race_for(model, self.opts.steps, self.opts.window, self.dry, "bf16")
        extra = (
            "parallel.compile=true",
            "optim.fused=true",
            "trainer.precision=fp8",
            f"parallel.compile_cache={self.work / f'cache-{model}-fp8'}",
        )
        fp8 = train_hpctrain(race, self.work, f"{model}-fp8", model, extra, self.peaks)
        say(f"  bf16: {fmt_mfu(bf16)}")
        say(f"  fp8:  {fmt_mfu(fp8)}")
        say(f"  throughput fp8 / bf16 = {fp8.tokens_per_s / bf16.tokens_per_s:.3f}")
        say("  step    loss bf16    loss fp8    fp8 − bf16")
        for step in sorted(set(bf16.losses) & set(fp8.losses)):
            a, b = bf16.losses[step], fp8.losses[step]
            say(f"  {step:>4}  {a:10.4f}  {b:10.4f}  {b - a:+10.4f}")
        self.figures.fp8 = {
            "bf16": _figure(bf16),
            "fp8": _figure(fp8),
            "ratio": fp8.tokens_per_s / bf16.tokens_per_s,
        }

    def cache(self) -> None:
        import compile_cache as cc

        model = self.model_for(CACHE_MODEL)
        say(f"\n== compile cache: first step of a resumed {model} run, with and without the cache ==")
        trained = self.bf16_run(model)
        assert trained.run_dir is not None
        race = race_for(model, self.opts.steps, self.opts.window, self.dry, "fp32" if self.dry else "bf16")
        ckpt = trained.run_dir / "checkpoints" / f"step_{race.steps:08d}"
        overrides = [
            "data=race_markov",
            f"trainer.micro_batch_size={race.micro_batch}",
            f"trainer.precision={race.precision}",
            "optim.fused=true",
        ]
        starts = []
        for r in range(self.opts.cache_rounds):
            for kind in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
                folder = self.caches[model] if kind == "warm" else self.work / f"empty-cache-{r}"
                start = cc.resume(
                    self.work,
                    f"resume-{kind}{r}",
                    kind,
                    model,
                    overrides,
                    ckpt,
                    race.steps,
                    folder,
                    self.work / "project",
                    prefix=["--config-dir", "conf"],
                )
                say(f"  {cc.describe(start)}")
                starts.append(start)
        for line in cc.summary(starts):
            say(f"  {line}")
        self.figures.cache = {"starts": [vars(s) for s in starts]}

    def tests(self) -> None:
        say("\n== CUDA path checks: python -m pytest -m gpu tests/gpu ==")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "tests/gpu",
                "-q",
                "-s",
                "-rA",
                "-p",
                "no:cacheprovider",
                "--durations=0",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, **pythonpath()},
        )
        lines = done.stdout.strip().splitlines()
        keep = [line for line in lines if line.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR", "gpt2_"))]
        for line in [*keep, *lines[-1:]]:
            say(f"  {line}")
        if done.returncode not in (0, 5):
            say(done.stdout[-4000:])
            say(done.stderr[-2000:])
        self.figures.tests = {"returncode": done.returncode, "summary": lines[-1] if lines else ""}


def _figure(t: Trained) -> dict[str, Any]:
    return {
        "step_s": t.step_s,
        "tokens_per_s": t.tokens_per_s,
        "mfu": t.mfu,
        "mfu_measured_peak": t.mfu_measured_peak,
        "losses": t.losses,
    }


def _version(v: Any) -> str:
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def pythonpath() -> dict[str, str]:
    """hpctrain from this checkout for every process the check starts (installed or not)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated of {', '.join(SECTIONS)}"
    )
    parser.add_argument("--steps", type=int, default=60, help="training steps of each run")
    parser.add_argument("--window", type=int, default=10, help="steps per timed window")
    parser.add_argument("--cache-rounds", type=int, default=1, help="cold and warm resumed starts each")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run on the CPU with the tiny built-in gpt: tries the script, gives NO GPU figure",
    )
    opts = parser.parse_args(argv)
    opts.sections = [s.strip() for s in opts.only.split(",") if s.strip()]
    unknown = [s for s in opts.sections if s not in SECTIONS]
    if unknown or not opts.sections:
        parser.error(f"--only {opts.only!r}: choose from {', '.join(SECTIONS)}")
    if opts.steps % opts.window or opts.steps // opts.window < 3:
        parser.error("--steps must be a multiple of --window, at least 3 windows (warm-up, measured, last)")
    if opts.cache_rounds < 1:
        parser.error("--cache-rounds must be ≥ 1")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if not opts.cpu_dry_run and not torch.cuda.is_available():
        print(
            f"bench/gpu.py: no CUDA GPU on this machine (torch {torch.__version__}); run it on a CUDA "
            "machine, or with --cpu-dry-run to try the script here",
            file=sys.stderr,
        )
        return 1
    # This checkout's hpctrain (an installed one may be another), and the benches beside this file.
    sys.path[:0] = [str(REPO), str(BENCH)]
    os.environ.update(pythonpath())
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hpctrain-gpu-") as tmp:
        check = Check(opts, Path(tmp))
        check.figures.device = describe_device(opts.cpu_dry_run)
        label = "CPU DRY RUN: these are NOT GPU figures" if opts.cpu_dry_run else "GPU check"
        say(
            f"hpctrain bench/gpu.py ({label}): "
            + ", ".join(f"{k} {v}" for k, v in check.figures.device.items())
        )
        if {"mfu", "fp8"} & set(opts.sections):
            check.measure_peaks()
        for section in SECTIONS:
            if section in opts.sections:
                getattr(check, section)()
                if opts.json:  # after each section: a run stopped by a time limit keeps what it measured
                    figures = {"label": label, **vars(check.figures)}
                    opts.json.write_text(json.dumps(figures, indent=1, default=str))
        say(f"\nbench/gpu.py done in {time.time() - started:.0f} s ({label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
