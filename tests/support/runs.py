"""Run and sweep directories written by hand, as a finished local run leaves them (config, metrics, rank
logs, Hydra's record of the overrides): for tests of what reads them (status, logs, summary, report) that need
no training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hpctrain.config.compose import compose
from hpctrain.config.io import write_run_config
from hpctrain.rundir import RunDir


def local_run(
    run_dir: Path, overrides: list[str], records: list[dict[str, Any]], log_lines: int = 5, ranks: int = 1
) -> Path:
    """A run directory as ``hpctrain OVERRIDES`` leaves it after logging ``records``."""
    rd = RunDir(run_dir)
    write_run_config(run_dir, compose(overrides))
    rd.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    rd.logs.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        lines = [
            f"2026-11-26 10:00:{i:02d} rank{rank} INFO hpctrain.worker: line {i}" for i in range(log_lines)
        ]
        rd.log(rank).write_text("\n".join(lines) + "\n")
    hydra = run_dir / ".hydra"
    hydra.mkdir(exist_ok=True)
    (hydra / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    return run_dir


def steps(n: int, loss: float = 2.0, **every: float) -> list[dict[str, Any]]:
    """``n`` logged steps of a falling loss (and the given keys at every step)."""
    return [{"step": s, "loss": loss / s, **every} for s in range(1, n + 1)]


def local_sweep(sweep_dir: Path, members: list[tuple[list[str], list[dict[str, Any]]]]) -> Path:
    """A sweep run here (``-m`` with cluster=local): numbered member runs, and the multirun.yaml Hydra's
    sweeper writes beside them (what it holds is not read back)."""
    for i, (overrides, records) in enumerate(members):
        local_run(sweep_dir / str(i), overrides, records)
    RunDir(sweep_dir).multirun.write_text(
        OmegaConf.to_yaml(OmegaConf.create({"hydra": {"mode": "MULTIRUN"}}))
    )
    return sweep_dir
