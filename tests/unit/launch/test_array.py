"""Launchers by profile (hpctrain.launch: the ``Launcher`` protocol of hpctrain.launch.base) and a sweep
member's objective (hpctrain.launch.array): the final val_loss, else the loss, a torn last line skipped.
(Sweeps run here and as job arrays: tests/e2e/observe/test_report.py, tests/e2e/submit/, tests/slurm/.)"""

from __future__ import annotations

import inspect
from pathlib import Path

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch import get_launcher
from hpctrain.launch.array import final_objective
from hpctrain.launch.base import Launcher
from hpctrain.launch.local import LocalLauncher
from hpctrain.launch.sbatch import SbatchLauncher
from hpctrain.launch.submitit import SubmititLauncher
from hpctrain.rundir import RunDir


def test_each_profile_gets_its_launcher_and_each_keeps_the_protocol() -> None:
    chosen = {
        "local": get_launcher(to_typed(compose([]))),
        "submitit": get_launcher(to_typed(compose(["cluster=slurm_test"]))),
        "sbatch": get_launcher(to_typed(compose(["cluster=slurm_test", "launcher=sbatch"]))),
    }
    assert [type(v) for v in chosen.values()] == [LocalLauncher, SubmititLauncher, SbatchLauncher]
    protocol = inspect.signature(Launcher.launch)
    for launcher in chosen.values():
        assert inspect.signature(type(launcher).launch).parameters.keys() == protocol.parameters.keys()


def test_the_objective_is_the_final_val_loss_else_the_loss(tmp_path: Path) -> None:
    metrics = RunDir(tmp_path).metrics
    assert final_objective(tmp_path) is None  # nothing logged yet
    metrics.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0, "val_loss": 2.25}\n')
    assert final_objective(tmp_path) == 2.25
    metrics.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n{"step": 3, "lo')
    assert final_objective(tmp_path) == 2.0
