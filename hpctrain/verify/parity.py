"""Does every parallel layout train like one process? ``python -m hpctrain.verify.parity`` prints the table.

Each case trains the same tiny model on the same global batches for 10 steps (``--steps``) under one layout,
through the real trainer (``fit``: data sharding, pipeline schedules, clipping, evaluation and a checkpoint at
the end), and is compared with the single-process run: the largest relative gap of its losses, and of the
final validation loss. In fp32 the layouts differ only in the order of floating-point sums, so the gaps stay
at rounding level (tolerance 1e-5).

Cases of one world size share one launch of that many processes (gloo on CPU, NCCL on GPUs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.verify.layouts import LAYOUTS, MODELS, Layout, OnLayout
from hpctrain.verify.local_group import run_local_group

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

    from hpctrain.config.schema import Config
    from hpctrain.rendezvous.env import DistEnv

TOLERANCE = 1e-5
STEPS = 10  # the table's default; the suite runs it with fewer (tests/e2e/parallel/test_layouts.py)

_COMMON = [
    "data=synthetic",
    "data.num_samples=512",
    "trainer.global_batch_size=8",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.ckpt_every=0",
    "trainer.watchdog_factor=0",
    "optim.warmup_steps=2",
    "logger.progress_bar=false",
]
_L = LAYOUTS


@dataclass(frozen=True)
class Case(OnLayout):
    layout: Layout
    overrides: tuple[str, ...]  # on top of the layout's: micro-batch size, precision, checkpointing, ...
    models: tuple[str, ...] = ("gpt", "vit")
    tolerance: float = TOLERANCE
    reference: str = "1 process"  # the single-process case this one is compared with
    name: str = ""  # the layout's name unless given


AC_FULL, AC_SELECTIVE = (
    "parallel.activation_checkpointing=full",
    "parallel.activation_checkpointing=selective",
)
# ViT (a class token, 17 positions: padding under sequence parallelism) runs where the layout meets the
# model's shape: data parallelism, FSDP, TP with SP, one schedule of each kind (1F1B; the V schedule, two
# stages on a rank), 2d and 3d. The other schedules and FSDP/AC variants differ from those only in code the
# model never reaches: GPT alone runs them.
GPT = ("gpt",)
CASES = [
    Case(_L["ddp"], ("trainer.micro_batch_size=2",)),  # 2 passes: gradient accumulation
    Case(_L["fsdp zero3"], ("trainer.micro_batch_size=4",)),
    Case(_L["fsdp zero2"], ("trainer.micro_batch_size=2",), GPT),  # 2 passes: accumulation under FSDP
    Case(_L["fsdp offload"], ("trainer.micro_batch_size=4",), GPT),
    Case(_L["fsdp zero3"], (AC_FULL, "trainer.micro_batch_size=4"), GPT, name="fsdp + full AC"),
    Case(_L["tp"], ("trainer.micro_batch_size=4",), GPT),
    Case(_L["tp + sp"], ("trainer.micro_batch_size=8",)),
    Case(_L["tp + sp"], (AC_SELECTIVE, "trainer.micro_batch_size=8"), name="tp + sp + selective AC"),
    # 2 pipeline steps of 4 micro-batches of 1: gradient accumulation over pipeline steps
    Case(_L["pp gpipe"], ("trainer.micro_batch_size=1",), GPT),
    Case(_L["pp 1f1b"], ("trainer.micro_batch_size=2",)),
    Case(_L["pp interleaved 1f1b"], ("trainer.micro_batch_size=2",), GPT),
    Case(_L["pp interleaved zero bubble"], ("trainer.micro_batch_size=2",), GPT),
    Case(_L["pp zbv zero bubble"], ("trainer.micro_batch_size=2",)),
    Case(_L["2d (fsdp 2 × tp 2)"], ("trainer.micro_batch_size=4",)),
    Case(_L["hsdp (2 × 2)"], ("trainer.micro_batch_size=2",), GPT),
    Case(_L["3d (pp 2 × fsdp 2 × tp 2)"], ("trainer.micro_batch_size=2",)),
]
# Mixed precision and compilation, against the same fp32 single-process run: bf16 rounds every activation
# to 8 significant bits, so these agree to about 1e-3 rather than to rounding level.
MIXED_TOLERANCE = 1e-2
FP16, BF16 = "trainer.precision=fp16", "trainer.precision=bf16"
EXTRA_CASES = [
    Case(
        _L["ddp"],
        (FP16, "trainer.micro_batch_size=4"),
        ("gpt",),
        MIXED_TOLERANCE,
        name="ddp fp16 (GradScaler)",
    ),
    Case(
        _L["fsdp zero3"],
        (BF16, "trainer.micro_batch_size=4"),
        ("gpt",),
        MIXED_TOLERANCE,
        name="fsdp bf16 (MixedPrecisionPolicy)",
    ),
    Case(
        _L["fsdp zero3"],
        (FP16, "trainer.micro_batch_size=4"),
        ("gpt",),
        MIXED_TOLERANCE,
        name="fsdp fp16 (ShardedGradScaler)",
    ),
    Case(
        _L["tp + sp"],
        (BF16, "trainer.micro_batch_size=8"),
        ("gpt",),
        MIXED_TOLERANCE,
        name="tp + sp bf16 (autocast)",
    ),
    Case(
        _L["pp 1f1b"],
        (BF16, "trainer.micro_batch_size=2"),
        ("gpt",),
        MIXED_TOLERANCE,
        name="pp 1f1b bf16 (autocast)",
    ),
    Case(
        _L["fsdp zero3"],
        ("parallel.compile=true", "trainer.micro_batch_size=4"),
        ("gpt",),
        name="fsdp + compile",
    ),
]
# Context parallelism at seq 1024 (cp 2, cp 4, with TP and with FSDP), and a 4-expert top-2 mixture of
# experts under expert parallelism (alone, with FSDP, with TP), tensor parallelism (the experts run whole on
# the gathered sequence) and 4d (pp × cp × tp: experts, ring attention, pipeline and TP in one run).
CP, MOE = ("gpt_long",), ("gpt_moe",)
CASES += [
    Case(_L["cp 2"], ("trainer.micro_batch_size=8",), CP),
    Case(_L["cp 4"], ("trainer.micro_batch_size=8",), CP),
    Case(_L["cp 2 × tp 2"], ("trainer.micro_batch_size=8",), CP),
    Case(_L["cp 2 × fsdp 2"], ("trainer.micro_batch_size=4",), CP),
    Case(_L["ep 2"], ("trainer.micro_batch_size=4",), MOE),
    Case(_L["ep 2 × fsdp 2"], ("trainer.micro_batch_size=2",), MOE),
    Case(_L["ep 2 × tp 2"], ("trainer.micro_batch_size=4",), MOE),
    Case(_L["tp + sp"], ("trainer.micro_batch_size=8",), MOE, name="tp + sp, experts whole"),
]
REFERENCE = Case(
    _L["none"],
    ("trainer.micro_batch_size=8",),
    ("gpt", "vit", "gpt_long", "gpt_moe", "gpt_lora"),
    name="1 process",
)
# LoRA adapters (base frozen) under data parallelism, FSDP (frozen and trained parameters in one unit), a
# pipeline and tensor parallelism (the adapters split as the Linear they adapt).
LORA = ("gpt_lora",)
CASES += [
    Case(_L["ddp"], ("trainer.micro_batch_size=4",), LORA, name="ddp, lora"),
    Case(_L["fsdp zero3"], ("trainer.micro_batch_size=4",), LORA, name="fsdp, lora"),
    Case(_L["pp 1f1b"], ("trainer.micro_batch_size=2",), LORA, name="pp 1f1b, lora"),
    Case(_L["tp"], ("trainer.micro_batch_size=8",), LORA, name="tp, lora"),
    Case(_L["tp + sp"], ("trainer.micro_batch_size=8",), LORA, name="tp + sp, lora"),
]
# The load-balancing loss is a product of shares over the tokens of one forward, not a sum over them: a
# pipeline's micro-batches are compared with one process accumulating micro-batches of the same size.
MICRO_REFERENCE = Case(_L["none"], ("trainer.micro_batch_size=4",), MOE, name="1 process, micro-batches of 4")
CASES.append(
    Case(_L["4d (pp 2 × cp 2 × tp 2)"], ("trainer.micro_batch_size=4",), MOE, reference=MICRO_REFERENCE.name)
)
# GPT-2's tied embedding and LM head under tensor parallelism: one vocabulary-split weight for both.
TIED = "model.tie_embeddings=true"
TIED_REFERENCE = Case(_L["none"], ("trainer.micro_batch_size=8", TIED), ("gpt",), name="1 process, tied")
CASES.append(
    Case(
        _L["tp + sp"],
        ("trainer.micro_batch_size=8", TIED),
        ("gpt",),
        reference=TIED_REFERENCE.name,
        name="tp + sp, tied embeddings",
    )
)
# Tied under pipeline parallelism: the first and last stages each hold a copy, kept equal by Megatron's
# embedding group (hpctrain.parallel.shared). The V schedule: both copies on rank 0 (summed locally); 3d:
# sharded by FSDP and split by TP alike. 1F1B, the copies on two ranks, is
# tests/e2e/parallel/test_tied_pipeline.py's case; interleaved 1F1B places them as 1F1B does (first stage on
# the first rank, last on the last).
CASES += [
    Case(
        _L[layout],
        ("trainer.micro_batch_size=2", TIED),
        ("gpt",),
        reference=TIED_REFERENCE.name,
        name=f"{layout}, tied embeddings",
    )
    for layout in ("pp zbv zero bubble", "3d (pp 2 × fsdp 2 × tp 2)")
]


def overrides(case: Case, model: str, steps: int = STEPS) -> list[str]:
    return [*MODELS[model], *_COMMON, f"trainer.max_steps={steps}", *case.layout.args(), *case.overrides]


class _Recorder:
    """Stands in for the run's Observer on rank 0: keeps the logged records."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def start(self, start_step: int, total_steps: int, wandb_run_id: str | None) -> str | None:
        return wandb_run_id

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def advance(self, step: int, loss: float | None = None) -> None:
        pass


def _worker(env: DistEnv, device: torch.device, jobs: list[tuple[str, DictConfig, Config]], out: str) -> None:
    """One rank: train every (case, model) of this world size in turn; rank 0 writes their records."""
    import torch.distributed as dist

    from hpctrain.config.io import write_run_config
    from hpctrain.config.shape import run_shape
    from hpctrain.resilience.signals import StopSignals
    from hpctrain.resilience.stop import StopCheck
    from hpctrain.resilience.watchdog import Watchdog
    from hpctrain.train.trainer import fit

    rank = env.rank
    results = {}
    for key, composed, cfg in jobs:
        run_dir = Path(out).parent / key.replace(": ", "-").replace(" ", "_").replace("/", "_")
        if rank == 0:
            write_run_config(run_dir, composed)
        dist.barrier()
        recorder = _Recorder() if rank == 0 else None
        stop = StopCheck(StopSignals(set()), None, rank == 0, device)
        watchdog = Watchdog(run_dir, rank, env.hostname, 0.0, 0.0, lambda culprit, why: None)
        start = time.perf_counter()
        fit(cfg, run_shape(cfg), env, device, run_dir, recorder, stop, watchdog)  # type: ignore[arg-type]
        watchdog.close()
        if recorder is not None:
            results[key] = {"records": recorder.records, "seconds": time.perf_counter() - start}
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def run_cases(cases: list[Case], work_dir: Path, steps: int = STEPS) -> dict[str, dict[str, Any]]:
    """Train every case (and the single-process references); return records keyed ``"model: case"``."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.check import check_run

    # Composed, typed and checked here, once per case, not by each of its ranks (a composition is ~0.1 CPU-s).
    by_world: dict[int, list[tuple[str, DictConfig, Config]]] = {}
    needed = {(c.reference, model) for c in cases for model in c.models}
    references = [
        r for r in (REFERENCE, TIED_REFERENCE, MICRO_REFERENCE) if any(c.reference == r.name for c in cases)
    ]
    for case in [*references, *cases]:
        for model in case.models:
            if case in references and (case.name, model) not in needed:
                continue  # a reference only for the models compared with it
            composed = compose(overrides(case, model, steps))
            cfg = to_typed(composed)
            check_run(cfg)
            by_world.setdefault(case.ranks, []).append((f"{model}: {case.name}", composed, cfg))
    results: dict[str, dict[str, Any]] = {}
    for world, jobs in sorted(by_world.items()):
        out = work_dir / f"world{world}" / "results.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        run_local_group(_worker, world, jobs, str(out))
        results.update(json.loads(out.read_text()))
    return results


@dataclass
class Row:
    model: str
    case: Case
    loss_gap: float  # largest relative gap of the per-step losses to the single-process run
    val_gap: float
    final_loss: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.loss_gap <= self.case.tolerance and self.val_gap <= self.case.tolerance


def compare(results: dict[str, dict[str, Any]], cases: list[Case], steps: int = STEPS) -> list[Row]:
    rows = []
    for case in cases:
        for model in case.models:
            ours, ref = results[f"{model}: {case.name}"], results[f"{model}: {case.reference}"]
            losses = [r["loss"] for r in ours["records"]]
            ref_losses = [r["loss"] for r in ref["records"]]
            if len(losses) != steps or len(ref_losses) != steps:
                raise RuntimeError(f"{model}: {case.name}: {len(losses)} losses logged, expected {steps}")
            gap = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
            val, ref_val = ours["records"][-1]["val_loss"], ref["records"][-1]["val_loss"]
            rows.append(Row(model, case, gap, abs(val - ref_val) / abs(ref_val), losses[-1], ours["seconds"]))
    return rows


def format_table(rows: list[Row], steps: int = STEPS) -> str:
    width = max(len(r.case.name) for r in rows) if rows else 6
    lines = [
        f"{'model':<5} {'layout':<{width}} {'ranks':>5} {'loss gap':>9} {'val gap':>9} {f'loss@{steps}':>8} "
        f"{'time s':>7} {'tolerance':>9}  ok"
    ]
    for r in rows:
        lines.append(
            f"{r.model:<5} {r.case.name:<{width}} {r.case.ranks:>5} {r.loss_gap:>9.1e} {r.val_gap:>9.1e} "
            f"{r.final_loss:>8.4f} {r.seconds:>7.1f} {r.case.tolerance:>9.0e}  {'yes' if r.ok else 'NO'}"
        )
    lines.append(
        f"gaps: largest relative difference to one fp32 process over {steps} steps (losses) and at the end "
        "(validation loss)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpctrain.verify.parity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", nargs="*", help="run only the cases whose name contains one of these")
    parser.add_argument("--fp32-only", action="store_true", help="leave out mixed precision and compile")
    parser.add_argument("--models", nargs="*", choices=sorted(MODELS), help="run only these models' rows")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per case (default {STEPS}; ≥ 3)")
    args = parser.parse_args(argv)
    if args.steps < 3:  # warm-up (2 steps) and at least one step on the decaying schedule
        parser.error("--steps must be at least 3")
    every = CASES if args.fp32_only else [*CASES, *EXTRA_CASES]
    cases = [c for c in every if not args.only or any(word in c.name for word in args.only)]
    if args.models:
        kept = [replace(c, models=tuple(m for m in c.models if m in args.models)) for c in cases]
        cases = [c for c in kept if c.models]
    with tempfile.TemporaryDirectory(prefix="hpctrain-parity-") as tmp:
        rows = compare(run_cases(cases, Path(tmp), args.steps), cases, args.steps)
    print(format_table(rows, args.steps))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
