"""The run directory: every path of a run and the format of every file in it. Torch-free.

    <run>/config.yaml                 the resolved config (written once at launch, read by every worker)
    <run>/job.json                    the Slurm job of a run (hpctrain status/logs/cancel)
    <run>/sweep.json                  a sweep directory's members (one Slurm array)
    <run>/metrics.jsonl               rank 0's logged records, one JSON object per line
    <run>/ranks.json                  every rank's host and pid
    <run>/rendezvous.json             the port rank 0 of a Slurm job start listens on (when it had to move)
    <run>/logs/rank<R>.log            each rank's log; rank<R>.error.json: the error it died of
    <run>/heartbeats/rank<R>.json     the hang watchdog's heartbeats
    <run>/checkpoints/step_<N>/       committed checkpoints (hpctrain.rundir.checkpoints)
    <run>/checkpoints/lineage.json    the lineage the run continues (with the checkpoint fast tier on)
    <checkpoint.local_path>/hpctrain-fast-<uid>/...   node-local: the fast tier (hpctrain.rundir.checkpoints)
    <run>/profile/                    torch.profiler traces (logger.tensorboard: tensorboard/plugins/profile/)
    <run>/tensorboard/                TensorBoard event files (logger.tensorboard)
    <run>/plots/                      hpctrain report's PNGs
    <run>/.lock                       the exclusive lock of the run using it (hpctrain.rundir.lock)

Everything else asks :class:`RunDir` for a path; nothing else spells these names. Writes go through
:func:`hpctrain.rundir.files.atomic_write`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.rundir.files import JsonlWriter, atomic_json, atomic_write, read_json, read_jsonl
from hpctrain.rundir.lock import LOCK_FILE, RunLock

RUN_CONFIG = "config.yaml"
JOB_RECORD = "job.json"
SWEEP_RECORD = "sweep.json"
METRICS_FILE = "metrics.jsonl"
RANKS_FILE = "ranks.json"
RENDEZVOUS_FILE = "rendezvous.json"
# Hydra's record of a sweep's members (written by Hydra's launchers).
MULTIRUN_RECORD = "multirun.yaml"


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    # ------------------------------------------------------------------------------------------ paths
    @property
    def config(self) -> Path:
        return self.path / RUN_CONFIG

    @property
    def job(self) -> Path:
        return self.path / JOB_RECORD

    @property
    def sweep(self) -> Path:
        return self.path / SWEEP_RECORD

    @property
    def multirun(self) -> Path:
        return self.path / MULTIRUN_RECORD

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def ranks(self) -> Path:
        return self.path / RANKS_FILE

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def error_file(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.error.json"

    def error_files(self) -> list[Path]:
        return sorted(self.logs.glob("rank*.error.json")) if self.logs.is_dir() else []

    @property
    def heartbeats(self) -> Path:
        return self.path / "heartbeats"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / f"rank{rank}.json"

    def heartbeat_files(self) -> list[Path]:
        return sorted(self.heartbeats.glob("rank*.json")) if self.heartbeats.is_dir() else []

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def profile(self) -> Path:
        return self.path / "profile"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's log directory: event files, and profiler traces under plugins/profile/."""
        return self.path / "tensorboard"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def hydra_overrides(self) -> Path:
        return self.path / ".hydra" / "overrides.yaml"

    def is_run(self) -> bool:
        """Whether this looks like a run directory (any of the files a run leaves)."""
        return any(p.is_file() for p in (self.config, self.metrics, self.job))

    # ------------------------------------------------------------------------------------------ files
    def write_config_text(self, text: str) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config, text)
        return self.config

    def read_metrics(self, tail_bytes: int | None = None) -> list[dict[str, Any]]:
        """metrics.jsonl's step records (a torn or partly read line is skipped)."""
        return [r for r in read_jsonl(self.metrics, tail_bytes) if "step" in r]

    def metrics_writer(self) -> JsonlWriter:
        return JsonlWriter(self.metrics)

    def write_ranks(self, ranks: list[dict[str, object]]) -> None:
        atomic_json(self.ranks, ranks)

    def max_steps(self) -> int | None:
        """``trainer.max_steps`` of the run's config.yaml; None when missing, partly written or unreadable."""
        from omegaconf import OmegaConf  # a plain YAML read, no resolution

        try:
            return int(OmegaConf.load(self.config).trainer.max_steps)
        except Exception:  # missing, partly written or from another version: progress shows the step only
            return None

    @property
    def rendezvous(self) -> Path:
        return self.path / RENDEZVOUS_FILE

    def write_rendezvous(self, record: dict[str, Any]) -> None:
        atomic_json(self.rendezvous, record)

    def read_rendezvous(self) -> dict[str, Any] | None:
        found = read_json(self.rendezvous)
        return found if isinstance(found, dict) else None

    def read_ranks(self) -> list[dict[str, Any]] | None:
        found = read_json(self.ranks)
        return found if isinstance(found, list) else None


__all__ = [
    "JOB_RECORD",
    "LOCK_FILE",
    "METRICS_FILE",
    "MULTIRUN_RECORD",
    "RANKS_FILE",
    "RUN_CONFIG",
    "SWEEP_RECORD",
    "RunDir",
    "RunLock",
    "atomic_json",
    "atomic_write",
]
