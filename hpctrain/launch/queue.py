"""The queue in view: when Slurm would start a run in each partition it may go to (``sbatch --test-only``,
which submits nothing), for a dry run and ``hpctrain plan``. Torch-free."""

from __future__ import annotations

from datetime import datetime

from hpctrain.config.schema import ClusterConfig
from hpctrain.slurm import commands
from hpctrain.slurm.remote import Remote
from hpctrain.slurm.spec import parse_time_limit

NOW_S = 5.0  # an estimate this close to now is "now"


def resource_options(c: ClusterConfig) -> list[str]:
    """The sbatch options that decide where and when a job of this profile can start."""
    options = [
        f"--nodes={c.nodes + c.spare_nodes}",
        f"--ntasks-per-node={c.tasks_per_node}",
        f"--cpus-per-task={c.cpus_per_task}",
        f"--time={parse_time_limit(c.time)}",
    ]
    if c.time_min is not None:  # what backfill may start it with: its estimate is then earlier
        options.append(f"--time-min={parse_time_limit(c.time_min)}")
    if c.gpus_per_node:
        options.append(f"--gpus-per-node={c.gpus_per_node}")
    for key in ("account", "qos", "mem", "constraint", "exclude", "reservation", "gres"):
        value = getattr(c, key)
        if value is not None:
            options.append(f"--{key}={value}")
    if c.exclusive:
        options.append("--exclusive")
    return options


def start_estimates(c: ClusterConfig) -> list[str]:
    """One line per partition the run may go to (``cluster.partition``'s list, else every partition):
    Slurm's estimated start, or why it cannot run there. A line saying why, when no Slurm client answers."""
    remote = Remote(c.ssh, c.ssh_config) if c.ssh else None  # cluster.ssh: Slurm answers on the login node
    try:
        with commands.use_remote(remote):
            names = c.partition.split(",") if c.partition else commands.partitions()
            estimates = [commands.start_estimate(name, resource_options(c)) for name in names]
    except (commands.SlurmUnavailable, RuntimeError, OSError) as err:
        return [f"queue: not asked ({err})"]
    width = max((len(e.partition) for e in estimates), default=0)
    lines = []
    for e in estimates:
        if e.start is None:
            lines.append(f"queue: {e.partition:<{width}}  cannot start there: {e.detail}")
        else:
            lines.append(f"queue: {e.partition:<{width}}  starts {_when(e.start)} ({e.detail})")
    return lines


def _when(start: str) -> str:
    try:
        seconds = (datetime.fromisoformat(start) - datetime.now()).total_seconds()
    except ValueError:
        return start
    return f"now ({start})" if seconds <= NOW_S else f"{start}, in {_duration(seconds)}"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{max(minutes, 1)} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours < 48 else f"{hours // 24} days {hours % 24} h"
