"""Host memory (RAM) of a run, per rank and per node: what the kernel's or the cgroup's OOM killer counts.

``hpctrain plan`` prints it beside the GPU's table, compares it with ``cluster.mem`` where that is set, and a
rank killed by the OOM killer is named with it (:mod:`hpctrain.launch.exits`: "at 21.3 GiB peak RSS (plan:
18.0 GiB)"). Torch-free, from the plan (:mod:`hpctrain.plan.estimate`) and the config alone.

What lives in host memory, per rank:

- the worker process: Python, torch and hpctrain's modules (:data:`PROCESS_BYTES`);
- the model state wherever it is not on a GPU: all of a CPU run's memory (the plan's per-rank total), or
  what ``parallel.cpu_offload`` keeps on the host;
- ``trainer.async_checkpoint``: the writer process (:data:`WRITER_BYTES`) and the staged copy of the rank's
  parameters and optimizer state (hpctrain.checkpoint.staging);
- ``checkpoint.local_every``: the fast tier's copies in node-local memory (``checkpoint.local_path``,
  /dev/shm by default: RAM), the rank's own and its peer's (hpctrain.checkpoint.fast);
- ``data.num_workers``: torch's DataLoader fork server and each loader process (:data:`LOADER_BYTES`);

and once per node the launcher or restart agent and the fork server (:data:`NODE_BYTES`).

The process sizes are proportional set sizes (``Pss`` of /proc/PID/smaps_rollup, which shares each page
among the processes that map it, as the cgroup counts it once) measured on 2026-12-07 with torch 2.13 (CPU)
on the smallest built-in GPT, 2 ranks, rounded up; a worker started as a fresh interpreter instead of forked
from the fork server maps torch alone (its RSS, 0.30 GiB), which :data:`PROCESS_BYTES` takes. On a GPU
node, the CUDA runtime's own host pages come on top and are not counted (no GPU to measure them here).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config.schema import Config
from hpctrain.plan.estimate import Estimate, slurm_mem_bytes
from hpctrain.plan.layout import MIB
from hpctrain.plan.units import size

PROCESS_BYTES = 310 * MIB  # a worker: Python, torch, hpctrain (RSS of a fresh interpreter)
WRITER_BYTES = 210 * MIB  # an asynchronous checkpoint's writer process and its resource tracker (Pss)
LOADER_BYTES = 64 * MIB  # a DataLoader process, and the DataLoader's own fork server (Pss each)
NODE_BYTES = 150 * MIB  # the launcher or a task's restart agent, and the fork server (Pss)


@dataclass(frozen=True)
class HostMemory:
    per_rank: dict[str, int]  # what each rank keeps in host memory, by part (bytes; the largest rank)
    per_node: dict[str, int]  # what a node keeps once
    ranks_per_node: int
    limit: int | None  # cluster.mem of a Slurm profile, bytes per node; None: unknown (all of the node)

    @property
    def rank_total(self) -> int:
        return sum(self.per_rank.values())

    @property
    def node_total(self) -> int:
        return self.ranks_per_node * self.rank_total + sum(self.per_node.values())


def host_memory(cfg: Config, est: Estimate) -> HostMemory:
    """The run's host memory: the plan's largest rank (every rank of a node counted as it) and the node's."""
    mem = est.largest
    on_gpu = cfg.cluster.gpus_per_node > 0
    state = mem.params + mem.optimizer + mem.host  # what a checkpoint holds of the rank (its model state)
    rank = {"process": PROCESS_BYTES}
    if not on_gpu:
        rank["model, activations, buffers"] = mem.total
    if mem.host:
        rank["offloaded state"] = mem.host
    if cfg.trainer.async_checkpoint:
        rank["checkpoint writer and staging"] = WRITER_BYTES + state
    if cfg.checkpoint.local_every:
        rank["fast tier (own and peer copy)"] = 2 * state
    if cfg.data.num_workers:
        rank["data loader processes"] = (cfg.data.num_workers + 1) * LOADER_BYTES
    c = cfg.cluster
    ranks = c.tasks_per_node if c.kind == "slurm" else c.nproc  # a node's ranks (config.shape.world_size)
    limit = slurm_mem_bytes(c.mem) if c.kind == "slurm" else None
    return HostMemory(rank, {"launcher or agent, fork server": NODE_BYTES}, ranks, limit)


def host_table(cfg: Config, est: Estimate) -> list[str]:
    """The plan's host-memory rows: each part of the largest rank, the node's own, the node's total, and how
    it compares with ``cluster.mem``."""
    host = host_memory(cfg, est)
    width = 62
    lines = [f"host memory per node ({host.ranks_per_node} rank{'s' * (host.ranks_per_node != 1)})"]
    for name, n in host.per_rank.items():
        lines.append(f"  {name:<{width + 17}}{size(n):>11}")
    lines.append(f"  {'per rank':<{width + 17}}{size(host.rank_total):>11}")
    for name, n in host.per_node.items():
        lines.append(f"  {name:<{width + 17}}{size(n):>11}")
    once = sum(host.per_node.values())
    total = f"total per node: {host.ranks_per_node} × {size(host.rank_total)} + {size(once)}"
    lines.append(f"  {total:<{width + 17}}{size(host.node_total):>11}")
    if cfg.cluster.gpus_per_node > 0:
        lines.append("  (the CUDA runtime's own host pages come on top: not counted)")
    if host.limit is not None:
        spare = host.limit - host.node_total
        said = f"{size(spare)} to spare" if spare >= 0 else f"DOES NOT FIT: {size(-spare)} over"
        lines.append(f"  cluster.mem={cfg.cluster.mem}: {said}")
    return lines


@dataclass(frozen=True)
class Planned:
    """The plan's memory of the largest rank: in host memory, and on its GPU (None: no GPU, or unknown)."""

    host: int | None
    gpu: int | None


def planned(cfg: Config) -> Planned:
    """The plan's figures of a rank, from the config alone (both None where the plan needs the user's model
    measured: a ``_target_`` without declared shapes, torch, which no supervisor loads)."""
    from hpctrain.errors import ConfigError
    from hpctrain.plan.estimate import estimate

    try:
        est = estimate(cfg)
    except (ConfigError, ValueError, ZeroDivisionError):
        return Planned(None, None)
    gpu = est.largest.total if cfg.cluster.gpus_per_node > 0 else None
    return Planned(host_memory(cfg, est).rank_total, gpu)
