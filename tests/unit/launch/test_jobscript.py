"""The lines a Slurm job runs before its tasks (hpctrain.launch.jobscript): ``cluster.setup`` verbatim, as
typed; ``cluster.env`` values quoted, never executed; the package and the user's project on PYTHONPATH."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpctrain.config.schema import ClusterConfig
from hpctrain.launch.jobscript import setup_lines
from hpctrain.launch.project import PROJECT_DIR_ENV

SLURM = "cluster=slurm_test"


# --- cluster.setup lines are shell by design: verbatim in the job script, each on its own line
def printed_script(stdout: str) -> str:
    """The job script a dry run of the sbatch launcher prints (it writes none)."""
    return stdout.split("sbatch script (as submission would write it):\n", 1)[1].split(
        "\nWithout dry_run", 1
    )[0]


@pytest.mark.parametrize("template", ["srun", "torchrun"])
def test_setup_lines_reach_the_job_script_verbatim(cli, tmp_path: Path, template: str):  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "render"
    lines = ["source $HOME/venv/bin/activate && cd ~/proj", 'echo "$VIRTUAL_ENV" | tr a-z A-Z > ~/out']
    result = cli(
        SLURM,
        "launcher=sbatch",
        f"cluster.sbatch_template={template}",
        "dry_run=true",
        "cluster.setup=[" + ",".join(f"'{line}'" for line in lines) + "]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr
    script = printed_script(result.stdout)
    assert not run_dir.exists(), "a dry run writes nothing"
    for line in lines:
        assert f"\n{line}\n" in script, script
    # Run the setup part with a HOME of the test's own: $HOME, &&, ~ and the pipe act as typed.
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "proj").mkdir()
    (home / "venv" / "bin" / "activate").write_text("export VIRTUAL_ENV=myenv\n")
    setup = script[script.index(lines[0]) : script.index(lines[1]) + len(lines[1])]
    ran = subprocess.run(
        ["bash", "-c", setup + "\npwd"], capture_output=True, text=True, env={"HOME": str(home)}
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(home / "proj")
    assert (home / "out").read_text().strip() == "MYENV"


def test_env_values_are_never_executed_and_setup_lines_are_shell(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "render"
    result = cli(
        "cluster=slurm_test",
        "launcher=sbatch",
        "dry_run=true",
        f"cluster.setup=['echo hi; touch {tmp_path}/setup_ran']",
        f"+cluster.env.X='$(touch {tmp_path}/pwned)'",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    script = result.stdout.split("sbatch script (as submission would write it):\n", 1)[1]
    # The part of the job that runs before srun: the exports and the setup commands.
    setup = script[script.index("set -euo pipefail") : script.index("\nexec srun")]
    ran = subprocess.run(
        ["bash", "-c", setup + '\nprintf "X=%s\\n" "$X"'], cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert "hi\n" in ran.stdout  # cluster.setup is shell by design: both commands of the line ran
    assert f"X=$(touch {tmp_path}/pwned)" in ran.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["setup_ran"]  # the dry run wrote nothing


def test_slurm_setup_lines_put_the_project_after_the_package(tmp_path: Path):
    lines = setup_lines(ClusterConfig(), tmp_path / "code", tmp_path / "code" / "project" / "sub", tmp_path)
    assert (
        lines[0]
        == f"export PYTHONPATH={tmp_path}/code:{tmp_path}/code/project/sub${{PYTHONPATH:+:$PYTHONPATH}}"
    )
    assert f"export {PROJECT_DIR_ENV}={tmp_path}" in lines


def test_a_flexible_walltime_job_carries_its_requested_limit(cli, tmp_path: Path):  # type: ignore[no-untyped-def]
    """cluster.time_min: the script asks for --time-min and exports the whole limit in minutes, which a
    requeue asks for again (Slurm would keep the shorter limit backfill granted: see test_walltime)."""
    result = cli(
        SLURM,
        "launcher=sbatch",
        "dry_run=true",
        "cluster.time=2:00:00",
        "cluster.time_min=0:30:00",
        f"hydra.run.dir={tmp_path / 'render'}",
    )
    assert result.returncode == 0, result.stderr
    script = printed_script(result.stdout)
    assert "#SBATCH --time-min=30" in script and "#SBATCH --time=2:00:00" in script
    assert "export HPCTRAIN_REQUESTED_TIME=120" in script
    assert "time limit 2:00:00 (at least 0:30:00: backfill may grant less)" in result.stdout + result.stderr
    plain = cli(SLURM, "launcher=sbatch", "dry_run=true", f"hydra.run.dir={tmp_path / 'plain'}")
    assert "time-min" not in printed_script(plain.stdout) and "REQUESTED_TIME" not in plain.stdout
