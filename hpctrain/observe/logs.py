"""Where each rank's log lines go: ``logs/rank<R>.log`` for every rank, the console for rank 0."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hpctrain.rundir import RunDir


def setup_logging(run_dir: Path, rank: int, console_handler: logging.Handler | None) -> None:
    """Every rank logs to logs/rank<R>.log; rank 0 also to the console (a terminal, or Slurm's output)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    stamped = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    if "HPCTRAIN_LAUNCHER_PID" in os.environ:
        to_file: logging.Handler = logging.StreamHandler(sys.stderr)  # the local launcher redirects it there
    else:
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(RunDir(run_dir).log(rank))
    to_file.setFormatter(stamped)
    root.addHandler(to_file)
    if console_handler is None and rank == 0 and "HPCTRAIN_LAUNCHER_PID" not in os.environ:
        console_handler = logging.StreamHandler(sys.stdout)
    if console_handler is not None:
        console_handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(console_handler)
