"""``hpctrain plan OVERRIDES...``: memory per GPU, time and cost per run, and layouts that fit, as a table.

Takes the overrides a training command would (``hpctrain plan model=gpt2_350m parallel=fsdp
cluster=a100x32``), starts nothing. Exit status: 0 when the run fits (or there is no GPU to judge: CPU
profiles report host memory only), 1 when it does not fit, 2 for a bad config. Torch-free for the built-in
models; a model without declared shapes (a user's ``_target_``) is measured first (:func:`measured_for`),
which imports torch.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from hpctrain.cli.measured import activation_line, human_bytes, measured_for, measured_model_line
from hpctrain.config.schema import Config
from hpctrain.config.shape import global_batch_size, samples_per_pass
from hpctrain.errors import ConfigError
from hpctrain.models.facts import MeasuredModel
from hpctrain.models.spec import model_spec
from hpctrain.plan.estimate import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    MIB,
    Estimate,
    RankMemory,
    estimate,
    gib,
    human_count,
)
from hpctrain.plan.search import Alternative, alternatives

EXIT_DOES_NOT_FIT = 1
EXIT_BAD_CONFIG = 2
WHAT_WIDTH = 62  # the description column of the memory table


def _model_line(cfg: Config, est: Estimate) -> str:
    if est.measured is not None:
        return measured_model_line(est)
    return f"{human_count(est.n_params)}-parameter {est.model} ({model_spec(cfg.model).describe()})"


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
    per_pass = samples_per_pass(cfg)
    passes = f"{lay.passes} pass{'es' * (lay.passes > 1)}"
    pieces = f"{passes} × {lay.degrees.dp} data-parallel × micro-batch {lay.micro_batch}"
    if lay.degrees.pp > 1:
        pieces += f" × {lay.microbatches} pipeline micro-batches"
    tokens = f" ({global_batch_size(cfg) * lay.tokens:,} tokens)"
    if est.measured is not None and est.measured.input_kind != "tokens":
        tokens = ""
    return f"{global_batch_size(cfg)} samples per step{tokens} = {pieces} (a pass: {per_pass})"


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
    if est.measured is not None:
        flying = (
            f"measured, micro-batch {est.layout.micro_batch}" if not est.measured.note else "not measured"
        )
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
    lines = [
        "time per step (estimate)",
        f"  {'compute':<34}{t.compute_s:>9.3f} s  {t.flops_per_step / 1e15:.3g} PFLOP{recompute} at "
        f"{c.achievable_mfu:.0%} of peak over {est.world} GPUs",
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
    rate = f"{human_count(t.tokens_per_s)} tokens/s" if model_spec(cfg.model).input_kind == "tokens" else ""
    rate = ", ".join(x for x in (rate, f"{human_count(t.samples_per_s)} samples/s") if x)
    lines.append(f"  {'step':<34}{t.step_s:>9.3f} s  {rate}, MFU {t.mfu:.1%}")
    cost = f", ${t.cost:,.2f} at ${c.cost_per_gpu_hour:g} per GPU-hour" if t.cost is not None else ""
    lines.append(f"  {f'{cfg.trainer.max_steps} steps':<34}{t.gpu_hours:>9.2f} GPU-hours{cost}")
    return lines


def alternatives_table(cfg: Config, alts: list[Alternative]) -> list[str]:
    same = (
        f"same {cfg.cluster.name} ranks, {global_batch_size(cfg)} samples per step, {cfg.trainer.precision}"
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
    if est.measured is not None:  # a user's model: how its numbers were found
        acts = est.measured.activations_in(est.layout.regime)
        how = est.measured.note
        if acts is not None:
            how = f"measured on CPU ({human_bytes(acts.saved.per_sample)} per sample)"
        text += f"; {est.n_params:,} parameters read on the meta device, activations {how}"
    return text


def check_fits(cfg: Config, measured: MeasuredModel | None = None) -> Estimate:
    """The check before a submission to GPUs: the estimate, or a one-line ConfigError with its numbers and
    the fastest layout that fits. ``measured``: the facts of a model without declared shapes."""
    est = estimate(cfg, measured)
    v = est.verdict
    if v.kind != "gpu" or v.fits:
        return est
    mem = est.largest
    reason = (
        f"plan: {human_count(est.n_params)}-parameter {est.model} needs {gib(mem.total):.1f} GiB per GPU "
        f"(params {gib(mem.params):.1f} + grads {gib(mem.grads):.1f} + optimizer {gib(mem.optimizer):.1f} + "
        f"activations {gib(mem.activations):.1f} + buffers {gib(mem.buffers):.1f}) but "
        f"{cfg.cluster.name} has {cfg.cluster.gpu_memory_gib:g} GiB, {gib(v.usable):.1f} after the "
        f"{gib(v.reserve):.1f} GiB reserve "
        f"for the CUDA context and fragmentation"
    )
    alts = alternatives(cfg, limit=1, measured=measured)
    if alts:
        best = alts[0]
        step = f", ~{best.estimate.time.step_s:.2g} s per step" if best.estimate.time is not None else ""
        valid = (
            f"a layout that fits, e.g. {' '.join(best.overrides)} ({gib(best.estimate.largest.total):.1f} GiB"
            f"{step}; `hpctrain plan` with the same overrides lists more), or plan_check=false"
        )
    else:
        valid = (
            "a smaller model or micro-batch or more GPUs (no layout of these ranks fits), or plan_check=false"
        )
    raise ConfigError("", None, reason, valid=valid)


def machine_memory_bytes() -> int | None:
    """This machine's memory (MemTotal of /proc/meminfo), or None where there is no such file."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits_here(cfg: Config, measured: MeasuredModel | None = None) -> Estimate | None:
    """The check before a run of CPU processes on this machine: every process holds its model state and
    activations in this machine's memory; a run that cannot fit in all of it is a one-line ConfigError."""
    total = machine_memory_bytes()
    if total is None:
        return None
    est = estimate(cfg, measured)
    per_rank = est.largest.total + est.largest.host
    need = per_rank * est.world
    if need <= total:
        return est
    raise ConfigError(
        "",
        None,
        f"plan: {human_count(est.n_params)}-parameter {est.model} needs about {gib(per_rank):.1f} GiB per "
        f"process × {est.world} process{'es' * (est.world > 1)} = {gib(need):.1f} GiB, more than this "
        f"machine's {gib(total):.1f} GiB of memory",
        valid="a smaller model or micro-batch, fewer processes (cluster.nproc), or plan_check=false",
    )


def run(name: str, argv: list[str]) -> int:
    """``hpctrain plan OVERRIDES... [--top N] [--config-dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="hpctrain plan",
        description="Memory per GPU, step time and cost of a run, and layouts that fit; starts nothing.",
        epilog="Exit status: 0 fits (or nothing to judge), 1 does not fit, 2 bad config.",
    )
    parser.add_argument(
        "overrides", nargs="*", help="the overrides a training command takes, e.g. model=gpt2_350m"
    )
    parser.add_argument("--top", type=int, default=3, help="how many alternative layouts to list (default 3)")
    parser.add_argument("--config-dir", "-cd", help="your config directory, searched besides hpctrain's")
    args = parser.parse_args(argv)
    from hpctrain.cli.common import user_config_dirs
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.check import check_run

    try:
        cfg = to_typed(compose(args.overrides, user_config_dirs(args.config_dir)))
        check_run(cfg)
        measured = measured_for(cfg)
        est = estimate(cfg, measured)
    except ConfigError as err:
        user_traceback = getattr(err, "user_traceback", None)  # the user's own code raised: show where
        if user_traceback:
            print(user_traceback, file=sys.stderr, end="")
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    alts = alternatives(cfg, limit=args.top, measured=measured) if args.top > 0 else []
    print(report(cfg, est, alts))
    return EXIT_DOES_NOT_FIT if not est.verdict.fits else 0
