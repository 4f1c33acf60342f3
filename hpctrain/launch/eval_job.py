"""``trainer.eval_job=PROFILE``: the script of the evaluation job that the training job submits after each
committed checkpoint (``RUN_DIR/eval.sbatch``), written at submission from the cluster profile PROFILE.

One task on one node of PROFILE's partition, account, time and resources runs ``hpctrain eval RUN_DIR --step
$HPCTRAIN_EVAL_STEP`` from the run's code snapshot (the same package the training job runs). The training job
submits it with ``--dependency=after:<its own id>`` in a background thread (:mod:`hpctrain.task.train`):
training never waits for an evaluation. Torch-free.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.launch.jobscript import container_srun_args, setup_lines
from hpctrain.launch.project import project_dir
from hpctrain.launch.snapshot import plan_project, project_path_entry
from hpctrain.rundir import RunDir
from hpctrain.slurm.commands import EVAL_STEP_ENV

STEP_ENV = EVAL_STEP_ENV  # the step to evaluate, exported by the training job at each submission


def eval_profile(name: str, config_dirs: list[Path] | None = None) -> ClusterConfig:
    """The cluster profile ``name`` as composed (ConfigError when there is none so named)."""
    from hpctrain.config.compose import compose, to_typed

    return to_typed(compose([f"cluster={name}"], config_dirs or [])).cluster


def render_eval_script(profile: ClusterConfig, run_dir: Path, snapshot_root: Path) -> str:
    """The evaluation job's script: ``profile``'s resources, one task, the code snapshot under
    ``snapshot_root`` (the run's directory, or its sweep's) on the path."""
    c = profile
    output = str(RunDir(run_dir).slurm).replace("%", "%%") + "/eval-%j.out"
    options = [
        f"--job-name={c.job_name}-eval",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={c.cpus_per_task}",
        f"--time={c.time.strip()}",
        f"--output={shlex.quote(output)}",
    ]
    if c.gpus_per_node:
        options.append("--gpus-per-node=1")
    for key in ("partition", "account", "qos", "mem", "constraint", "exclude", "reservation"):
        value = getattr(c, key)
        if value is not None:
            options.append(f"--{key}={value}")  # validated: no character a shell or sbatch acts on
    plan = plan_project(project_dir(), c.snapshot_paths)
    python = "python" if c.container_image else sys.executable
    srun = " ".join(["srun --ntasks=1", *map(shlex.quote, container_srun_args(c))])  # a line of the script
    command = f'{shlex.join([python, "-m", "hpctrain", "eval", str(run_dir)])} --step "${STEP_ENV}"'
    return "\n".join(
        [
            "#!/bin/bash",
            f"# trainer.eval_job={c.name}: submitted by the training job after each committed checkpoint",
            *(f"#SBATCH {option}" for option in options),
            *setup_lines(
                c, RunDir(snapshot_root).code, project_path_entry(plan, snapshot_root), project_dir()
            ),
            f"{srun} {command}",
            "",
        ]
    )


def write_eval_script(cfg: Config, run_dir: Path, snapshot_root: Path) -> None:
    """Write the run's evaluation script when ``trainer.eval_job`` names a profile (owner-only)."""
    if cfg.trainer.eval_job is None:
        return
    path = RunDir(run_dir).eval_script
    path.touch(mode=0o700)
    path.chmod(0o700)
    path.write_text(render_eval_script(eval_profile(cfg.trainer.eval_job), run_dir, snapshot_root))
    RunDir(run_dir).slurm.mkdir(parents=True, exist_ok=True)  # Slurm does not create --output's folder
