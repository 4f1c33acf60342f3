"""Issue 17, item 1: the user's own training script under hpctrain (task=script), here on 2 processes;
bad task inputs are one line. (The pre-emption and requeue path: tests/slurm/test_script.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO, hpctrain

from hpctrain.cli import main

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
        "task=script", "task.path=train_ddp.py", "task.args=[--steps,6]", "cluster.nproc=2",
        f"hydra.run.dir={run}", cwd=project,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "finished at step 6" in (run / "logs" / "rank0.log").read_text()
    assert (run / "checkpoints" / "state.pt").is_file()
    again = hpctrain("task=script", "task.path=train_ddp.py", "task.args=[--steps,8]", "cluster.nproc=2",
                     f"hydra.run.dir={run}", cwd=project)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "resumed at step 6 (requeue 0)" in (run / "logs" / "rank0.log").read_text()


def test_a_failing_script_fails_the_run(project: Path, tmp_path: Path):
    run = tmp_path / "r"
    result = hpctrain(
        "task=script", "task.path=broken.py", "cluster.nproc=2", f"hydra.run.dir={run}", cwd=project
    )
    assert result.returncode != 0
    assert "task.path=broken.py exited with status 1" in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["task=script"], "task.path=null: missing or empty"),
        (["task=script", "task.path=nosuch.py"], "task.path=nosuch.py: no such file"),
        (["task=script", "task.path=../outside.py"], "task.path=../outside.py: not inside this folder"),
        (
            ["task=script", "task.path=train_ddp.py", "task.signal=KILL"],
            "task.signal=KILL: not a known choice",
        ),
        (["task=scripts"], "task=scripts: unknown option"),
        (["task=script", "task.path='train\x1bddp.py'"], "contains the control character"),
        (
            ["task=script", "task.path=train_ddp.py", "cluster=slurm_test", "task.signal=USR2"],
            "task.signal=USR2: is cluster.signal itself",
        ),
    ],
)
def test_bad_task_inputs_are_one_line(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, args: list[str], words: str
):
    (tmp_path / "outside.py").write_text("")
    monkeypatch.chdir(project)
    code = main([*args, "dry_run=true", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hpctrain: ") and words in err[0], err
