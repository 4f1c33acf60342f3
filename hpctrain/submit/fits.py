"""Does the run fit where it will run? The checks before a submission: GPU memory per rank on a GPU
cluster, this machine's memory for local processes. Each refusal is one line with its numbers and, on GPUs,
the fastest layout that fits. Torch-free (a user's model arrives measured)."""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.models.facts import MeasuredModel
from hpctrain.plan.estimate import Estimate, estimate, human_count
from hpctrain.plan.search import alternatives
from hpctrain.plan.text import split_line
from hpctrain.plan.units import duration, size


def check_fits(cfg: Config, measured: MeasuredModel | None = None) -> Estimate:
    """The check before a submission to GPUs: the estimate, or a one-line ConfigError with its numbers and
    the fastest layout that fits. ``measured``: the facts of a model without declared shapes."""
    est = estimate(cfg, measured)
    v = est.verdict
    if v.kind != "gpu" or v.fits:
        return est
    mem = est.largest
    reason = (
        f"plan: {human_count(est.n_params)}-parameter {est.model} needs {size(mem.total, 1)} per GPU "
        f"({split_line(mem)}) but {cfg.cluster.name} has {cfg.cluster.gpu_memory_gib:g} GiB, "
        f"{size(v.usable, 1)} after the {size(v.reserve, 1)} reserve for the CUDA context and fragmentation"
    )
    alts = alternatives(cfg, limit=1, measured=measured)
    if alts:
        best = alts[0]
        timed = best.estimate.time
        step = f", ~{duration(timed.step_s, 2)} per step" if timed is not None else ""
        valid = (
            f"a layout that fits, e.g. {' '.join(best.overrides)} ({size(best.estimate.largest.total, 1)}"
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
        f"plan: {human_count(est.n_params)}-parameter {est.model} needs about {size(per_rank, 1)} per "
        f"process × {est.world} process{'es' * (est.world > 1)} = {size(need, 1)}, more than this "
        f"machine's {size(total, 1)} of memory",
        valid="a smaller model or micro-batch, fewer processes (cluster.nproc), or plan_check=false",
    )
