"""The plan as text: the table ``hpctrain plan`` prints, the one line of a dry run, and how a measured
model's numbers were found. Sizes, times, FLOPs and money are written by :mod:`hpctrain.plan.units`, each
in the unit its value needs. Torch-free."""

from __future__ import annotations

import textwrap

from hpctrain.config.schema import PEAK_KEYS, Config
from hpctrain.config.shape import run_shape
from hpctrain.models.builtin import model_spec
from hpctrain.plan.estimate import CUDA_CONTEXT_GIB, FRAGMENTATION, Estimate, RankMemory, human_count
from hpctrain.plan.ettr import plan_line
from hpctrain.plan.host import host_table
from hpctrain.plan.search import MIN_RANK_COMPUTE_S, Alternative, SmallerFit
from hpctrain.plan.units import duration, flop, gpu_time, money, size
from hpctrain.precision import matmul_peak

WHAT_WIDTH = 62  # the description column of the memory table


def measured_model_line(est: Estimate) -> str:
    """The model row of the plan of a measured model."""
    m = est.facts
    blocks = f"{m.blocks} blocks" if m.blocks else "no blocks found"
    return (
        f"{human_count(est.n_params)}-parameter {est.model} ({m.target}: {est.n_params:,} parameters "
        f"read on the meta device, {blocks}{m.describe_input()})"
    )


def human_bytes(n: float) -> str:
    return size(n)


# What each peak prices, said beside it (hpctrain.precision.matmul_peak picks it from trainer.precision).
PEAK_NAMES = {
    "fp32": "fp32 peak (IEEE float32 matmuls: an fp32 run does not use TF32)",
    "tf32": "TF32 peak (float32 matmuls on TF32 tensor cores)",
    "bf16": "bf16/fp16 tensor-core peak",
    "fp8": "fp8 tensor-core peak",
}


def split_line(mem: RankMemory) -> str:
    """A rank's memory as its parts, each in its own unit (a dry run's line, the refusal of a run that does
    not fit)."""
    parts = (
        ("params", mem.params),
        ("grads", mem.grads),
        ("optimizer", mem.optimizer),
        ("activations", mem.activations),
        ("buffers", mem.buffers),
    )
    return " + ".join(f"{name} {size(n, 1)}" for name, n in parts)


def activation_line(est: Estimate) -> str | None:
    """How the activations of a model without declared shapes were found (None for the built-ins)."""
    m = est.facts.measured
    if m is None:
        return None
    if m.note:
        return f"activations  cannot be derived from the parameters and were {m.note}"
    lay = est.layout
    acts = m.in_regime(lay.regime)
    assert acts is not None
    regime = {"fp32": "fp32", "autocast": "bf16 autocast", "fsdp_mixed": "bf16 parameters"}[acts.regime]
    sizes = " and ".join(str(n) for n in m.samples)
    line = acts.saved
    text = (
        f"activations  measured (not derivable from parameters), a forward + backward of {sizes} samples on "
        f"CPU, {regime}: {human_bytes(line.per_sample)} per sample + {human_bytes(line.fixed)} fixed"
    )
    blocks = est.facts.blocks
    if lay.ac == "full" and blocks:
        kept = human_bytes(acts.checkpointed.per_sample)
        text += f"; checkpointed blocks keep their inputs: {kept} per sample"
    elif lay.ac != "none":
        why = "no blocks found to checkpoint" if not blocks else "selective checkpointing not measured"
        text += f"; an upper bound ({why})"
    if lay.degrees.tp > 1 or lay.degrees.pp > 1:
        text += "; split over tp/pp approximately (blocks by their share and tp; no TP/PP buffers counted)"
    return text


def _model_line(cfg: Config, est: Estimate) -> str:
    if est.measured is not None:
        return measured_model_line(est)
    line = f"{human_count(est.n_params)}-parameter {est.model} ({model_spec(cfg.model).describe()})"
    facts = est.facts
    if facts.n_active != facts.n_params:  # a mixture of experts: what a token uses of the total
        line += f"; {human_count(facts.n_active)} active per token of {human_count(facts.n_params)} in all"
    if facts.n_trainable != facts.n_params:  # adapters: what trains, the rest frozen
        line += f"; {facts.n_trainable:,} trained (adapters), the rest frozen"
    return line


def _cluster_line(cfg: Config, est: Estimate) -> str:
    c = cfg.cluster
    if c.kind == "local":
        where = f"{c.name}: {est.world} process{'es' * (est.world > 1)} on this machine"
    else:
        devices = f"{c.gpus_per_node} GPUs" if c.gpus_per_node else f"{c.tasks_per_node} tasks"
        where = f"{c.name}: {c.nodes} node{'s' * (c.nodes > 1)} × {devices} = {est.world} ranks"
    facts = []
    if c.gpu_memory_gib:
        facts.append(f"{c.gpu_memory_gib:g} GiB per GPU")
    kind = matmul_peak(cfg.trainer.precision)
    peak = c.peak(kind)
    if peak:
        facts.append(f"{peak / 1e12:g} TFLOP/s {kind} peak × {c.achievable_mfu:.0%} achievable")
    links = [
        f"{name} {value:g} Gbit/s"
        for name, value in (("NVLink", c.intra_node_gbps), ("network per node", c.inter_node_gbps))
        if value
    ]
    facts += links
    return where + (f"; {', '.join(facts)}" if facts else "")


def _layout_line(cfg: Config, est: Estimate) -> str:
    lay, p = est.layout, cfg.parallel
    extras = []
    if lay.sharded:
        extras.append("ZeRO-3" if p.reshard_after_forward else "ZeRO-2")
        if p.cpu_offload:
            extras.append("CPU offload")
    if lay.degrees.tp > 1:
        extras.append("sequence parallel" if lay.seq_shards > 1 else "no sequence parallel")
    if lay.degrees.pp > 1:
        per_rank = f", {lay.per_rank} stages per rank" if lay.per_rank > 1 else ""
        extras.append(f"{p.schedule}, {lay.microbatches} micro-batches{per_rank}")
    regime = {
        "fp32": "fp32",
        "autocast": f"{lay.precision} autocast",
        "fsdp_mixed": f"{lay.precision} FSDP mixed",
    }
    parts = [
        f"parallel={p.name} ({lay.degrees})",
        regime[lay.regime],
        cfg.optim.name,
        f"checkpointing {lay.ac}",
    ]
    return ", ".join(parts + extras)


def _batch_line(cfg: Config, est: Estimate) -> str:
    lay = est.layout
    per_pass = lay.shape.samples_per_pass
    passes = f"{lay.passes} pass{'es' * (lay.passes > 1)}"
    pieces = f"{passes} × {lay.degrees.dp} data-parallel × micro-batch {lay.micro_batch}"
    if lay.degrees.pp > 1:
        pieces += f" × {lay.microbatches} pipeline micro-batches"
    # In tokens where the model's positions per sample are known (declared, or token ids measured).
    batch = lay.shape.global_batch_size
    tokens = f" ({batch * lay.tokens:,} tokens)" if est.facts.tokens_per_sample else ""
    return f"{batch} samples per step{tokens} = {pieces} (a pass: {per_pass})"


def _parts(mem: RankMemory, names: tuple[str, ...]) -> str:
    shown = [f"{name} {size(mem.parts[name])}" for name in names if mem.parts.get(name)]
    return ", ".join(shown)


ACTIVATION_PARTS = (
    "blocks",
    "stage outputs",
    "input",
    "head and loss",
    "pipeline outputs",
    "saved for backward",
)


def memory_table(cfg: Config, est: Estimate) -> list[str]:
    mem, v = est.largest, est.verdict
    where = "GPU" if v.kind == "gpu" else "process"
    rank = f"pipeline rank {mem.pp_rank} of {est.layout.degrees.pp}, " if est.layout.degrees.pp > 1 else ""
    optimizer = {"adamw": "AdamW: exp_avg + exp_avg_sq (fp32) + step", "sgd": "SGD momentum buffer (fp32)"}
    if cfg.optim.name == "sgd" and cfg.optim.momentum == 0:
        optimizer["sgd"] = "SGD without momentum: none"
    shard = "sharded" if est.layout.sharded else "local"
    device = "host (offloaded)" if mem.host else f"fp32, {shard}"
    flying = f"{mem.blocks} blocks, {mem.in_flight} micro-batch{'es' * (mem.in_flight > 1)} in flight"
    measured = est.facts.measured
    if measured is not None:
        flying = f"measured, micro-batch {est.layout.micro_batch}" if not measured.note else "not measured"
    buffer_names = tuple(k for k in mem.parts if k not in ACTIVATION_PARTS)
    # Each size in the unit it needs (a 100k-parameter model's rows in KiB beside the GPU's 80 GiB).
    rows = [
        ("parameters", device, mem.params),
        ("gradients", device, mem.grads),
        ("optimizer state", optimizer[cfg.optim.name], mem.optimizer),
        ("activations", flying, mem.activations),
        ("", _parts(mem, ACTIVATION_PARTS), None),
        ("buffers", _parts(mem, buffer_names), mem.buffers),
    ]
    lines = [f"memory per {where} ({rank}the largest rank)"]
    for name, what, n in rows:
        wrapped = textwrap.wrap(what, WHAT_WIDTH) or [""]
        if n is not None:
            lines.append(f"  {name:<17}{wrapped[0]:<{WHAT_WIDTH}}{size(n):>11}")
            wrapped = wrapped[1:]
        lines += [f"  {'':<17}{line}" for line in wrapped if line]
    if mem.host:
        what = "parameters, gradients, optimizer state"
        lines.append(f"  {'host memory':<17}{what:<{WHAT_WIDTH}}{size(mem.host):>11}")
    lines.append(f"  {'total':<17}{'':<{WHAT_WIDTH}}{size(mem.total):>11}")
    if v.kind == "gpu":
        reserve = f"CUDA context {CUDA_CONTEXT_GIB:g} GiB + {FRAGMENTATION:.0%} fragmentation"
        lines.append(f"  {'reserve':<17}{reserve:<{WHAT_WIDTH}}{size(v.reserve):>11}")
        lines.append(f"  {'GPU memory':<17}{cfg.cluster.name:<{WHAT_WIDTH}}{size(v.capacity):>11}")
    if est.layout.degrees.pp > 1:
        totals = ", ".join(f"{m.pp_rank}: {size(m.total)}" for m in est.ranks)
        lines.append(f"  pipeline ranks: {totals}")
    return lines


def verdict_line(cfg: Config, est: Estimate) -> str:
    v = est.verdict
    if v.kind == "none":
        why = (
            "no GPU (cluster.gpus_per_node=0)"
            if not cfg.cluster.gpus_per_node
            else "cluster.gpu_memory_gib unknown"
        )
        return f"verdict   none: {why} and no cluster.mem; {size(v.need)} of host memory per process"
    usable = f"the {size(v.usable)} usable" + (" per process (cluster.mem)" if v.kind == "host" else "")
    if v.fits:
        return f"verdict   FITS: {size(v.margin)} ({v.margin_pct:.1f}%) to spare of {usable}"
    return f"verdict   DOES NOT FIT: {size(-v.margin)} ({-v.margin_pct:.1f}%) over {usable}"


def time_table(cfg: Config, est: Estimate) -> list[str]:
    t = est.time
    precision = cfg.trainer.precision
    if t is None:
        key = PEAK_KEYS[matmul_peak(precision)]
        return [
            f"time per step: not estimated (cluster.{key} unknown: {'an' if precision[0] == 'f' else 'a'} "
            f"{precision} run's matmuls are priced "
            f"at the {PEAK_NAMES[matmul_peak(precision)]})"
        ]
    c = cfg.cluster
    recompute = " (+ full-checkpointing recompute)" if est.layout.ac == "full" else ""
    float8 = ""
    if t.float8_share and c.peak_fp8_flops:
        float8 = f"; {t.float8_share:.0%} of the FLOPs in float8 at {c.peak_fp8_flops / 1e12:g} TFLOP/s peak"
    lines = [
        "time per step (estimate)",
        f"  {'compute':<34}{duration(t.compute_s):>11}  {flop(t.flops_per_step)}{recompute} at "
        f"{c.achievable_mfu:.0%} of the {PEAK_NAMES[t.peak_kind]}, {t.peak / 1e12:g} TFLOP/s "
        f"(cluster.{PEAK_KEYS[t.peak_kind]}), over {est.world} GPUs{float8}",
    ]
    for comm in t.comms:
        if comm.seconds is None:
            lines.append(f"  {comm.name:<34}{'?':>11}  {size(comm.bytes)} per rank (bandwidth unknown)")
            continue
        hidden = ""
        if comm.exposed_s == 0 and comm.seconds:
            hidden = ", hidden by compute"
        elif comm.exposed_s != comm.seconds and comm.exposed_s is not None:
            hidden = f", {duration(comm.exposed_s)} not hidden by compute"
        volume = f"{size(comm.bytes)} per rank over {comm.link}"
        lines.append(f"  {comm.name:<34}{duration(comm.seconds):>11}  {volume}{hidden}")
    if est.layout.degrees.pp > 1:
        lines.append(f"  {'pipeline bubble':<34}{t.bubble:>11.1%}")
    # The model's throughput unit, then samples.
    units = dict.fromkeys((est.facts.throughput_unit, "samples"))
    rate = ", ".join(f"{human_count(t.rate(unit))} {unit}/s" for unit in units)
    lines.append(f"  {'step':<34}{duration(t.step_s):>11}  {rate}, MFU {t.mfu:.1%}")
    cost = f", {money(t.cost)} at ${c.cost_per_gpu_hour:g} per GPU-hour" if t.cost is not None else ""
    lines.append(f"  {f'{cfg.trainer.max_steps} steps':<34}{gpu_time(t.gpu_hours):>11}{cost}")
    return lines


def alternatives_table(cfg: Config, alts: list[Alternative]) -> list[str]:
    same = (
        f"same {cfg.cluster.name} ranks, {run_shape(cfg).global_batch_size} samples per step, "
        f"{cfg.trainer.precision}"
    )
    if not alts:
        return [f"alternatives ({same}): none fits"]
    lines = [f"alternatives that fit ({same}), fastest first", f"  {'step':>9} {'memory':>11}  overrides"]
    for alt in alts:
        step = duration(alt.estimate.time.step_s) if alt.estimate.time is not None else "?"
        lines.append(f"  {step:>9} {size(alt.estimate.largest.total):>11}  {' '.join(alt.overrides)}")
    return lines


def ettr_line(cfg: Config, est: Estimate) -> str:
    """The projected ETTR at the plan's size (hpctrain.plan.ettr)."""
    c = cfg.cluster
    step_s = est.time.step_s if est.time is not None else None
    background = cfg.trainer.async_checkpoint
    return plan_line(est.world, est.n_params, c.storage_gbps, c.spare_nodes > 0, background, step_s)


def report(cfg: Config, est: Estimate, alts: list[Alternative]) -> str:
    lines = [
        f"model     {_model_line(cfg, est)}",
        f"cluster   {_cluster_line(cfg, est)}",
        f"layout    {_layout_line(cfg, est)}",
        f"batch     {_batch_line(cfg, est)}",
        "",
        *memory_table(cfg, est),
        *[line for line in [activation_line(est)] if line],
        verdict_line(cfg, est),
        "",
        *host_table(cfg, est),
        "",
        *time_table(cfg, est),
        ettr_line(cfg, est),
        "",
        *alternatives_table(cfg, alts),
    ]
    return "\n".join(lines)


def summary(cfg: Config, est: Estimate) -> str:
    """One line for a dry run: the verdict, the split, the time and the cost."""
    mem, v, t = est.largest, est.verdict, est.time
    split = split_line(mem)
    if v.kind == "gpu":
        head = f"{size(mem.total, 1)} per GPU ({split}) of {cfg.cluster.gpu_memory_gib:g} GiB"
        if v.fits:
            text = f"plan: fits: {head}, {size(v.margin, 1)} to spare after the {size(v.reserve, 1)} reserve"
        else:
            text = f"plan: DOES NOT FIT: {head} ({size(-v.margin, 1)} over)"
    else:
        text = f"plan: {size(v.need)} per process ({split})"
    if t is not None:
        cost = f", {money(t.cost)}" if t.cost is not None else ""
        text += f"; ~{duration(t.step_s)} per step, {gpu_time(t.gpu_hours)}{cost}"
        text += f" for {cfg.trainer.max_steps} steps"
    measured = est.facts.measured
    if measured is not None:  # a user's model: how its numbers were found
        acts = measured.in_regime(est.layout.regime)
        how = measured.note
        if acts is not None:
            how = f"measured on CPU ({human_bytes(acts.saved.per_sample)} per sample)"
        text += f"; {est.n_params:,} parameters read on the meta device, activations {how}"
    return text


def oversized_line(est: Estimate, fit: SmallerFit) -> str:
    """The warning of a run whose GPUs are far more than its model needs (:func:`hpctrain.plan.search.
    smallest_fit`), naming the smallest layout that fits."""
    assert est.time is not None
    best = fit.layout.estimate
    step = f", ~{duration(best.time.step_s)} per step" if best.time is not None else ""
    return (
        f"warning: {est.world} GPUs are far more than this {human_count(est.n_params)}-parameter {est.model} "
        f"needs: each computes {duration(est.time.compute_s)} of a step (under "
        f"{duration(MIN_RANK_COMPUTE_S)}, a step's fixed costs dominate); the smallest layout that fits is "
        f"{fit.ranks} GPU{'s' * (fit.ranks > 1)}: {' '.join(fit.cluster + fit.layout.overrides)} "
        f"({size(best.largest.total)} per GPU{step})"
    )
