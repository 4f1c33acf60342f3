"""The evaluation job's script (hpctrain.launch.eval_job): the profile's resources for one task, its output
under the run's slurm/, and the command that evaluates the step the training job names."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.launch.eval_job import eval_profile, render_eval_script
from hpctrain.rundir import RunDir


def test_the_script_runs_hpctrain_eval_of_the_named_step_on_one_task(tmp_path: Path) -> None:
    profile = eval_profile("a100x32")
    script = render_eval_script(profile, tmp_path / "run", tmp_path)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --ntasks=1" in lines
    assert "#SBATCH --gpus-per-node=1" in lines  # one GPU of the profile's, whatever it has per node
    assert f"#SBATCH --partition={profile.partition}" in lines
    assert any(
        line.startswith(f"#SBATCH --output={RunDir(tmp_path / 'run').slurm}/eval-%j.out") for line in lines
    )
    assert lines[-1].startswith("srun --ntasks=1 ") and lines[-1].endswith('--step "$HPCTRAIN_EVAL_STEP"')
    assert f"-m hpctrain eval {tmp_path / 'run'}" in lines[-1]


def test_a_profile_that_does_not_exist_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        eval_profile("no_such_profile")
