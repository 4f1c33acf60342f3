"""Issue 17, item 1: the user's own training script under hpctrain (task=script, hpctrain.task.script), here
on 2 processes. (Bad task inputs: tests/unit/task/test_script.py; pre-emption and requeue:
tests/slurm/test_script.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import REPO, hpctrain

SCRIPT = REPO / "examples" / "script" / "train_ddp.py"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / "train_ddp.py")
    (folder / "broken.py").write_text("import os\nraise SystemExit(f'rank {os.environ[\"RANK\"]} gave up')\n")
    return folder


def test_script_gets_torchrun_environment_and_checkpoint_dir(project: Path, tmp_path: Path):
    run = tmp_path / "run"
    result = hpctrain(
        "task=script",
        "task.path=train_ddp.py",
        "task.args=[--steps,6]",
        "cluster.nproc=2",
        f"hydra.run.dir={run}",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert "finished at step 6" in (run / "logs" / "rank0.log").read_text()
    assert (run / "checkpoints" / "state.pt").is_file()
    again = hpctrain(
        "task=script",
        "task.path=train_ddp.py",
        "task.args=[--steps,8]",
        "cluster.nproc=2",
        f"hydra.run.dir={run}",
        cwd=project,
    )
    assert again.returncode == 0, again.stderr
    assert "resumed at step 6 (requeue 0)" in (run / "logs" / "rank0.log").read_text()


def test_a_failing_script_fails_the_run(project: Path, tmp_path: Path):
    run = tmp_path / "r"
    result = hpctrain(
        "task=script", "task.path=broken.py", "cluster.nproc=2", f"hydra.run.dir={run}", cwd=project
    )
    assert result.returncode != 0
    assert "task.path=broken.py exited with status 1" in result.stderr + result.stdout
