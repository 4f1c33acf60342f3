"""``launcher=sbatch`` (hpctrain.launch.sbatch) without a cluster: every template renders every option as
valid bash, an unsafe job name is refused before anything is written, and each template renders a fixed
config exactly as its golden file (tests/unit/launch/golden/, regenerated with HPCTRAIN_UPDATE_GOLDEN=1).
(The jobs themselves: tests/slurm/test_sbatch.py.)"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.launch.sbatch import render_script
from tests.support import CLI
from tests.support.golden import GOLDEN_RUN_DIR, GOLDEN_RUNS, as_golden, check_golden, golden_project


@pytest.mark.parametrize("job_name", ["a;touch x", "$(touch x)", "a b", "x\ny"])
def test_unsafe_job_name_is_rejected_before_anything_is_written(
    cli: CLI, tmp_path: Path, job_name: str
) -> None:
    run_dir = tmp_path / "bad"
    # Not a dry run: refused before anything is written or submitted (no Slurm here: any client would fail).
    result = cli(
        "cluster=slurm_test",
        "launcher=sbatch",
        f"cluster.job_name='{job_name}'",
        f"hydra.run.dir={run_dir}",
        env={"SLURM_CONF": "/nonexistent/slurm.conf"},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: cluster.job_name="), result.stderr
    assert not run_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_templates_render_every_option_as_valid_bash(tmp_path: Path) -> None:
    overrides = [
        "cluster=a100x32",
        "launcher=sbatch",
        "cluster.account=proj",
        "cluster.qos=high",
        "cluster.exclude='gpu[01-03]'",
        "cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3'",
        "cluster.container_mounts=[/data:/data:ro]",
    ]
    run_dir = tmp_path / "it's a run %j"
    for template in ("srun", "torchrun"):
        cfg = to_typed(compose([*overrides, f"cluster.sbatch_template={template}"]))
        script = render_script(cfg, run_dir)
        checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        for line in (
            "#SBATCH --account=proj",
            "#SBATCH --qos=high",
            "#SBATCH --exclude=gpu[01-03]",
            "#SBATCH --constraint=a100_80gb",
            "#SBATCH --gpus-per-node=8",
            "#SBATCH --mem=0",
            "#SBATCH --signal=USR2@300",
            "#SBATCH --output='" + str(run_dir).replace("'", "'\"'\"'").replace("%", "%%") + "/slurm/%j.out'",
            "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3' --container-mounts=/data:/data:ro",
        ):
            assert line in script, (template, line)
        assert "{{" not in script and "{%" not in script
    assert "#SBATCH --cpus-per-task=96" in script  # torchrun: one task per node holds 8 × 12 CPUs


# --- golden renderings (submitit's habit): each template, for one fixed config, byte for byte
@pytest.mark.parametrize("name", list(GOLDEN_RUNS))
def test_each_template_renders_its_golden_file(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    project = golden_project(tmp_path, monkeypatch)
    script = render_script(to_typed(compose(GOLDEN_RUNS[name])), GOLDEN_RUN_DIR)
    check_golden(f"{name}.sbatch", as_golden(script, project))
    assert "not-written" not in script  # a secret cluster.env value stays in the environment


def test_an_array_script_runs_the_member_of_its_task(tmp_path: Path) -> None:
    """A sweep over cluster.ssh: one script per job array, whose task i trains the i-th member's directory
    (paths quoted, whatever they hold), with the sweep's code snapshot and Slurm output per array task."""
    sweep = tmp_path / "it's a sweep"
    members = [sweep / "0", sweep / "1 $(touch pwned)"]
    for template in ("srun", "torchrun"):
        cfg = to_typed(
            compose(
                ["cluster=slurm_test", "cluster.array_parallelism=3", f"cluster.sbatch_template={template}"]
            )
        )
        script = render_script(cfg, sweep, tmp_path, members)
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        assert "#SBATCH --array=0-1%3" in script and "/slurm/%A_%a.out" in script
        assert (
            script.rstrip().endswith('"$RUN_DIR"')
            and f"export PYTHONPATH={shlex.quote(str(sweep / 'code'))}" in script
        )
        selecting = [line for line in script.splitlines() if line.startswith("RUN_DIR")]
        chosen = subprocess.run(
            ["bash", "-c", "\n".join([*selecting, 'printf %s "$RUN_DIR"']), "x"],
            env={"SLURM_ARRAY_TASK_ID": "1"},
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert chosen.stdout == str(members[1]) and not (tmp_path / "pwned").exists()
