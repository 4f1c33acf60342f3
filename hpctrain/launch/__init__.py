"""Launchers start the worker processes of a validated run. Nothing here imports torch."""

from __future__ import annotations

from hpctrain.config.io import write_run_config
from hpctrain.config.schema import ClusterConfig
from hpctrain.launch.base import Launcher


def get_launcher(cluster: ClusterConfig) -> Launcher:
    if cluster.launcher == "local":
        from hpctrain.launch.local import LocalLauncher

        return LocalLauncher()
    raise ValueError(f"unknown launcher {cluster.launcher!r}")


__all__ = ["Launcher", "get_launcher", "write_run_config"]
