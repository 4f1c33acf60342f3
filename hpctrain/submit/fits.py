"""Does the run fit where it will run? The checks before a submission: GPU memory per rank on a GPU
cluster, this machine's memory for local processes. Each refusal is one line with its numbers and, on GPUs,
the fastest layout that fits. Torch-free (a user's model arrives measured)."""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.models.facts import MeasuredModel
from hpctrain.plan.estimate import Estimate, estimate, gib, human_count
from hpctrain.plan.search import alternatives


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
