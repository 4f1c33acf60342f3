"""The plan as text: the table ``hpctrain plan`` prints, the one line of a dry run, and how a measured
model's numbers were found. Torch-free."""

from __future__ import annotations

import textwrap

from hpctrain.config.schema import Config
from hpctrain.config.shape import run_shape
from hpctrain.models.builtin import model_spec
from hpctrain.plan.estimate import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    MIB,
    Estimate,
    RankMemory,
    gib,
    human_count,
)
from hpctrain.plan.search import Alternative

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
    return f"{n / MIB:.2f} MiB" if n >= MIB else f"{n / 2**10:.1f} KiB"


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
    if c.peak_flops:
        facts.append(f"{c.peak_flops / 1e12:g} TFLOP/s peak × {c.achievable_mfu:.0%} achievable")
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


def _parts(mem: RankMemory, names: tuple[str, ...], scale: int) -> str:
    shown = [f"{name} {mem.parts[name] / scale:.2f}" for name in names if mem.parts.get(name)]
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
    # GiB, or MiB for the small models of a CPU run.
    unit, scale = ("GiB", GIB) if max(mem.total, v.capacity) >= GIB else ("MiB", MIB)
    rows = [
        ("parameters", device, mem.params),
        ("gradients", device, mem.grads),
        ("optimizer state", optimizer[cfg.optim.name], mem.optimizer),
        ("activations", flying, mem.activations),
        ("", _parts(mem, ACTIVATION_PARTS, scale), None),
        ("buffers", _parts(mem, buffer_names, scale), mem.buffers),
    ]
    title = f"memory per {where} ({rank}the largest rank)"
    lines = [f"{title:<{19 + WHAT_WIDTH}}{unit:>8}"]
    for name, what, size in rows:
        wrapped = textwrap.wrap(what, WHAT_WIDTH) or [""]
        if size is not None:
            lines.append(f"  {name:<17}{wrapped[0]:<{WHAT_WIDTH}}{size / scale:>8.2f}")
            wrapped = wrapped[1:]
        lines += [f"  {'':<17}{line}" for line in wrapped if line]
    if mem.host:
        what = "parameters, gradients, optimizer state"
        lines.append(f"  {'host memory':<17}{what:<{WHAT_WIDTH}}{mem.host / scale:>8.2f}")
    lines.append(f"  {'total':<17}{'':<{WHAT_WIDTH}}{mem.total / scale:>8.2f}")
    if v.kind == "gpu":
        reserve = f"CUDA context {CUDA_CONTEXT_GIB:g} + {FRAGMENTATION:.0%} fragmentation"
        lines.append(f"  {'reserve':<17}{reserve:<{WHAT_WIDTH}}{v.reserve / scale:>8.2f}")
        lines.append(f"  {'GPU memory':<17}{cfg.cluster.name:<{WHAT_WIDTH}}{v.capacity / scale:>8.2f}")
    if est.layout.degrees.pp > 1:
        totals = ", ".join(f"{m.pp_rank}: {m.total / scale:.2f}" for m in est.ranks)
        lines.append(f"  pipeline ranks ({unit}): {totals}")
    return lines


def verdict_line(cfg: Config, est: Estimate) -> str:
    v = est.verdict
    if v.kind == "none":
        why = (
            "no GPU (cluster.gpus_per_node=0)"
            if not cfg.cluster.gpus_per_node
            else "cluster.gpu_memory_gib unknown"
        )
        return f"verdict   none: {why} and no cluster.mem; {gib(v.need):.2f} GiB of host memory per process"
    usable = f"the {gib(v.usable):.2f} GiB usable" + (
        " per process (cluster.mem)" if v.kind == "host" else ""
    )
    if v.fits:
        return f"verdict   FITS: {gib(v.margin):.2f} GiB ({v.margin_pct:.1f}%) to spare of {usable}"
    return f"verdict   DOES NOT FIT: {gib(-v.margin):.2f} GiB ({-v.margin_pct:.1f}%) over {usable}"


def time_table(cfg: Config, est: Estimate) -> list[str]:
    t = est.time
    if t is None:
        return ["time per step: not estimated (cluster.peak_flops unknown)"]
    c = cfg.cluster
    recompute = " (+ full-checkpointing recompute)" if est.layout.ac == "full" else ""
    float8 = ""
    if t.float8_share and c.peak_fp8_flops:
        float8 = f"; {t.float8_share:.0%} of the FLOPs in float8 at {c.peak_fp8_flops / 1e12:g} TFLOP/s peak"
    lines = [
        "time per step (estimate)",
        f"  {'compute':<34}{t.compute_s:>9.3f} s  {t.flops_per_step / 1e15:.3g} PFLOP{recompute} at "
        f"{c.achievable_mfu:.0%} of peak over {est.world} GPUs{float8}",
    ]
    for comm in t.comms:
        if comm.seconds is None:
            lines.append(
                f"  {comm.name:<34}{'?':>9} s  {comm.bytes / 1e9:.3g} GB per rank (bandwidth unknown)"
            )
            continue
        hidden = f", {comm.exposed_s:.3f} s not hidden by compute" if comm.exposed_s != comm.seconds else ""
        volume = f"{comm.bytes / 1e9:.3g} GB per rank over {comm.link}"
        lines.append(f"  {comm.name:<34}{comm.seconds:>9.3f} s  {volume}{hidden}")
    if est.layout.degrees.pp > 1:
        lines.append(f"  {'pipeline bubble':<34}{t.bubble:>9.1%}")
    # The model's throughput unit, then samples.
    units = dict.fromkeys((est.facts.throughput_unit, "samples"))
    rate = ", ".join(f"{human_count(t.rate(unit))} {unit}/s" for unit in units)
    lines.append(f"  {'step':<34}{t.step_s:>9.3f} s  {rate}, MFU {t.mfu:.1%}")
    cost = f", ${t.cost:,.2f} at ${c.cost_per_gpu_hour:g} per GPU-hour" if t.cost is not None else ""
    lines.append(f"  {f'{cfg.trainer.max_steps} steps':<34}{t.gpu_hours:>9.2f} GPU-hours{cost}")
    return lines


def alternatives_table(cfg: Config, alts: list[Alternative]) -> list[str]:
    same = (
        f"same {cfg.cluster.name} ranks, {run_shape(cfg).global_batch_size} samples per step, "
        f"{cfg.trainer.precision}"
    )
    if not alts:
        return [f"alternatives ({same}): none fits"]
    lines = [f"alternatives that fit ({same}), fastest first", f"  {'step s':>8} {'GiB':>7}  overrides"]
    for alt in alts:
        step = f"{alt.estimate.time.step_s:.3f}" if alt.estimate.time is not None else "?"
        lines.append(f"  {step:>8} {gib(alt.estimate.largest.total):>7.2f}  {' '.join(alt.overrides)}")
    return lines


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
        *time_table(cfg, est),
        "",
        *alternatives_table(cfg, alts),
    ]
    return "\n".join(lines)


def summary(cfg: Config, est: Estimate) -> str:
    """One line for a dry run: the verdict, the split, the time and the cost."""
    mem, v, t = est.largest, est.verdict, est.time
    split = (
        f"params {gib(mem.params):.1f} + grads {gib(mem.grads):.1f} + optimizer {gib(mem.optimizer):.1f} + "
        f"activations {gib(mem.activations):.1f} + buffers {gib(mem.buffers):.1f}"
    )
    if v.kind == "gpu":
        text = (
            f"plan: fits: {gib(mem.total):.1f} GiB per GPU ({split}) of {cfg.cluster.gpu_memory_gib:g} GiB, "
        )
        text += f"{gib(v.margin):.1f} to spare after the {gib(v.reserve):.1f} GiB reserve"
        if not v.fits:
            text = (
                text.replace("plan: fits:", "plan: DOES NOT FIT:").split(", ")[0]
                + f" ({gib(-v.margin):.1f} over)"
            )
    else:
        text = f"plan: {gib(v.need):.2f} GiB per process ({split})"
    if t is not None:
        cost = f", ${t.cost:,.2f}" if t.cost is not None else ""
        text += f"; ~{t.step_s:.3g} s per step, {t.gpu_hours:.3g} GPU-hours{cost}"
        text += f" for {cfg.trainer.max_steps} steps"
    measured = est.facts.measured
    if measured is not None:  # a user's model: how its numbers were found
        acts = measured.in_regime(est.layout.regime)
        how = measured.note
        if acts is not None:
            how = f"measured on CPU ({human_bytes(acts.saved.per_sample)} per sample)"
        text += f"; {est.n_params:,} parameters read on the meta device, activations {how}"
    return text
