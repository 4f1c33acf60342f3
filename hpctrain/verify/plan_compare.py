"""What ``python -m hpctrain.verify.plan_measure`` measures and how it is judged: the cases (layouts of
:mod:`hpctrain.verify.layouts`), the estimate beside the measurement (one row per case, its largest rank),
the errors and the table. No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpctrain.verify.layouts import LAYOUTS, MODELS, Layout, OnLayout

if TYPE_CHECKING:
    pass

ACTIVATION_TOLERANCE = 0.15
# Steps per case, the last measured. The ones before set up what is created lazily: DDP rebuilds its
# gradient buckets in the second forward, FSDP initialises on the first, the pipeline its buffers.
STEPS = 3

_COMMON = ["data=synthetic", "trainer.max_steps=2", "logger.progress_bar=false", "optim.warmup_steps=1"]


@dataclass(frozen=True)
class Case(OnLayout):
    layout: Layout
    model: str
    overrides: tuple[str, ...]  # on top of the layout's: micro-batch size, precision, checkpointing, ...
    name: str = ""  # the layout's name unless given


_L = LAYOUTS
MB4, MB2 = "trainer.micro_batch_size=4", "trainer.micro_batch_size=2"
AC_FULL, AC_SELECTIVE = (
    "parallel.activation_checkpointing=full",
    "parallel.activation_checkpointing=selective",
)
BF16, TIED = "trainer.precision=bf16", "model.tie_embeddings=true"
CASES = [
    Case(_L["none"], "gpt", (MB4,)),
    Case(_L["none"], "vit", (MB4, AC_FULL), name="none, full AC"),
    Case(_L["none"], "gpt", (MB4, TIED), name="none, tied"),
    Case(_L["ddp"], "gpt", (MB4,)),
    Case(_L["ddp"], "vit", ("optim=sgd", MB4, AC_SELECTIVE), name="ddp sgd, selective AC"),
    Case(_L["ddp"], "gpt", (BF16, MB4), name="ddp bf16 (autocast)"),
    Case(_L["fsdp zero3"], "gpt", (MB4, AC_SELECTIVE), name="fsdp zero3, selective AC"),
    Case(_L["fsdp zero2"], "vit", (MB4,)),
    Case(_L["fsdp zero3"], "gpt", (BF16, MB4, AC_FULL), name="fsdp bf16, full AC"),
    Case(_L["tp + sp"], "gpt", (MB4,)),
    Case(_L["tp + sp"], "gpt", (MB4, TIED), name="tp + sp, tied"),
    Case(_L["tp"], "gpt", (MB4, AC_FULL), name="tp, full AC"),
    Case(_L["tp + sp"], "vit", (MB4, AC_SELECTIVE), name="tp + sp, selective AC"),
    Case(_L["pp 1f1b"], "gpt", (MB2,)),
    Case(_L["pp gpipe"], "vit", (MB2, AC_FULL), name="pp gpipe, full AC"),
    Case(_L["2d (fsdp 2 × tp 2)"], "gpt", (MB4,)),
    Case(_L["3d (pp 2 × tp 2)"], "gpt", (MB2, AC_SELECTIVE)),
    Case(_L["hsdp (2 × 2)"], "vit", (MB2, AC_FULL), name="hsdp (2 × 2), full AC"),
    # Issue 31: context parallelism at seq 1024, experts over ep ranks, LoRA's trained state.
    Case(_L["cp 2"], "gpt_long", (MB4,)),
    Case(_L["ep 2"], "gpt_moe", (MB4,)),
    Case(_L["fsdp zero3"], "gpt_lora", (MB4,), name="fsdp, lora"),
]


def overrides(case: Case) -> list[str]:
    return [*MODELS[case.model], *_COMMON, *case.layout.args(), *case.overrides]


# ------------------------------------------------------------------------------------- the comparison
@dataclass(frozen=True)
class Row:
    case: Case
    pp_rank: int
    measured: dict[str, int]  # params, grads, optimizer, held, saved (the largest rank)
    estimated: dict[str, int]  # params, grads, optimizer, activations
    state_exact_all_ranks: bool
    worst_activation_error: float  # the largest |estimate − held| / held over all ranks

    @property
    def activation_error(self) -> float:
        """Of the largest rank."""
        return _error(self.estimated["activations"], self.measured["held"])

    @property
    def ok(self) -> bool:
        return self.state_exact_all_ranks and self.worst_activation_error <= ACTIVATION_TOLERANCE


def _error(estimated: int, measured: int) -> float:
    return (estimated - measured) / measured


def estimated_for(cfg: Any, pp_rank: int, shard_rank: int) -> dict[str, int]:
    """The estimate's numbers for one rank's pipeline and FSDP coordinates."""
    from hpctrain.plan.layout import layout_of
    from hpctrain.plan.memory import rank_memory, rank_state_bytes

    lay = layout_of(cfg)
    mem = rank_memory(cfg, lay, pp_rank)
    return {
        **rank_state_bytes(cfg, lay, pp_rank, shard_rank),
        "activations": mem.activations,
        "copies": mem.parts.get("autocast weight copies", 0),
    }


def compare(results: dict[str, list[dict[str, Any]]], cases: list[Case]) -> list[Row]:
    """Each case against the estimate: model state exactly and activations within the tolerance on every
    rank; the row shows the largest rank."""
    from hpctrain.config.compose import compose, to_typed

    rows = []
    for case in cases:
        cfg = to_typed(compose(overrides(case)))
        ranks = results[f"{case.model}: {case.name}"]
        exact, worst = True, 0.0
        for r in ranks:
            est = estimated_for(cfg, r["pp_rank"], r["shard_rank"])
            exact &= all(est[k] == r[k] for k in ("params", "grads", "optimizer", "copies"))
            worst = max(worst, abs(_error(est["activations"], r["held"])))
        largest = max(ranks, key=lambda r: r["params"] + r["grads"] + r["optimizer"] + r["held"])
        estimated = estimated_for(cfg, largest["pp_rank"], largest["shard_rank"])
        rows.append(Row(case, largest["pp_rank"], largest, estimated, exact, worst))
    return rows


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def format_table(rows: list[Row]) -> str:
    def kib(n: int) -> str:
        return f"{n / 1024:.1f}"

    width = max(len(r.case.name) for r in rows)
    head = (
        f"{'model':<5} {'case':<{width}} {'ranks':>5} {'rank':>4} | {'params est/meas KiB':>19} "
        f"{'grads est/meas':>15} {'optim est/meas':>15} {'exact':>5} | {'act est':>7} {'saved':>7} "
        f"{'held':>7} {'error':>6} {'worst':>6}  ok"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        e, m = r.estimated, r.measured
        lines.append(
            f"{r.case.model:<5} {r.case.name:<{width}} {r.case.ranks:>5} {r.pp_rank:>4} | "
            f"{kib(e['params']) + '/' + kib(m['params']):>19} {kib(e['grads']) + '/' + kib(m['grads']):>15} "
            f"{kib(e['optimizer']) + '/' + kib(m['optimizer']):>15} {_yes(r.state_exact_all_ranks):>5} | "
            f"{kib(e['activations']):>7} {kib(m['saved']):>7} {kib(m['held']):>7} "
            f"{100 * r.activation_error:>+5.1f}% {100 * r.worst_activation_error:>5.1f}%  {_yes(r.ok)}"
        )
    lines.append(
        "KiB per rank, the largest rank of each case (rank = its pipeline rank). exact: parameters, "
        "gradients, optimizer state and autocast's weight copies equal the estimate on every rank. act: "
        "bytes left for the backward — saved: storages autograd packs (saved_tensors_hooks); held: every "
        "storage the forward created that is still alive (adds selective checkpointing's cache and the "
        "pipeline's kept outputs). error: estimate vs held; worst: the largest |error| over all ranks of the "
        f"case (tolerance {100 * ACTIVATION_TOLERANCE:.0f}%). On CPU: no GPU allocator peak measured "
        "(not verified)."
    )
    return "\n".join(lines)
