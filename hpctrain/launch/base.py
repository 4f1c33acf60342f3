"""The seam between the submit side and where workers run: local processes (:mod:`hpctrain.launch.local`) or a
Slurm job (:mod:`hpctrain.launch.submitit`, :mod:`hpctrain.launch.sbatch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from hpctrain.config.schema import Config


class Launcher(Protocol):
    def launch(self, cfg: Config, run_dir: Path) -> int:
        """Start the run's workers for ``cfg`` in ``run_dir`` (its config.yaml already written).

        Returns the exit status to report: 0 when the run finished (or, for a batch system, was queued)."""
        ...
