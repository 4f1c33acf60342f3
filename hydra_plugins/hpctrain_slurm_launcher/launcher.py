"""``hydra/launcher=hpctrain_slurm``: a multirun becomes one Slurm job array (see hpctrain.launch.array).

hpctrain selects it by itself for ``-m`` with a Slurm cluster profile. Kept import-light: Hydra imports every
plugin module at start-up, on login nodes too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class SlurmArrayLauncher(Launcher):
    def __init__(self, **_params: Any) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpctrain.launch.array import launch_array

        assert self.config is not None and self.hydra_context is not None, "setup() was not called"
        return launch_array(self.hydra_context, self.config, job_overrides, initial_job_idx)
