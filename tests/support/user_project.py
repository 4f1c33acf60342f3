"""Running a user's project (tests/conftest.py's ``project``: examples/user_project, copied) as its user
would: ``python -m hpctrain --config-dir conf ...`` from its folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import hpctrain, metrics

SHORT = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl"]


def user(project: Path, *args: str, timeout: float = 300):  # type: ignore[no-untyped-def]
    return hpctrain("--config-dir", "conf", *args, cwd=project, timeout=timeout)


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run)}


# --- a project folder of one's own (not examples/user_project): a package, a script, conf/ with a profile
MINE = "defaults:\n  - /schema/cluster/cluster@_here_\n  - _self_\nname: mine\nkind: local\nnproc: 1\n"


def make_project(root: Path) -> Path:
    """A project folder: a package, a script and conf/ with a cluster profile of its own."""
    (root / "userpkg").mkdir(parents=True)
    (root / "userpkg" / "__init__.py").write_text("")
    (root / "userpkg" / "nets.py").write_text("def build():\n    return 42\n")
    (root / "train_helpers.py").write_text("X = 1\n")
    for group in ("cluster", "model", "data"):
        (root / "conf" / group).mkdir(parents=True)
    (root / "conf" / "cluster" / "mine.yaml").write_text(MINE)
    (root / "conf" / "model" / "x.yaml").write_text("_target_: userpkg.nets.build\n")
    (root / "conf" / "data" / "y.yaml").write_text("_target_: userpkg.nets.build\n")
    return root


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)
