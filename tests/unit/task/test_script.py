"""The user's own training script (task=script, hpctrain.task.script): bad task inputs are one line, before
anything starts. (The script on 2 processes: tests/e2e/task/test_script.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpctrain.cli import main
from tests.support import REPO

SCRIPT = REPO / "examples" / "script" / "train_ddp.py"


@pytest.fixture
def script_project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / "train_ddp.py")
    (folder / "broken.py").write_text("import os\nraise SystemExit(f'rank {os.environ[\"RANK\"]} gave up')\n")
    return folder


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
    script_project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
):
    (tmp_path / "outside.py").write_text("")
    monkeypatch.chdir(script_project)
    code = main([*args, "dry_run=true", f"hydra.run.dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("hpctrain: ") and words in err[0], err
