"""Launchers start the worker processes of a validated run. Nothing here imports torch."""

from __future__ import annotations

from hpctrain.config.io import write_run_config
from hpctrain.config.schema import Config
from hpctrain.launch.base import Launcher


def get_launcher(cfg: Config) -> Launcher:
    """The launcher for a validated config: ``launcher=auto`` means local processes or submitit."""
    if cfg.cluster.kind == "local":
        from hpctrain.launch.local import LocalLauncher

        return LocalLauncher()
    if cfg.launcher == "sbatch" or cfg.cluster.ssh is not None:  # submitit's executor submits from here
        from hpctrain.launch.sbatch import SbatchLauncher

        return SbatchLauncher()
    from hpctrain.launch.submitit import SubmititLauncher

    return SubmititLauncher()


__all__ = ["Launcher", "get_launcher", "write_run_config"]
