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


# A user's model that raises at its third forward in every process: step 3 of every attempt that starts from
# step 0 (the user's deterministic bug of issue 43; line 14 raises).
BROKEN_MODEL = """import torch


class Broken(torch.nn.Module):
    def __init__(self, vocab_size: int = 256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, 8)
        self.out = torch.nn.Linear(8, vocab_size)
        self.calls = 0

    def forward(self, input_ids):
        self.calls += 1
        if self.calls > 2:
            raise ValueError("the user model breaks at its third forward")
        return self.out(self.emb(input_ids))
"""


def broken_project(root: Path) -> list[str]:
    """A project folder with :data:`BROKEN_MODEL` as ``model=broken``; the overrides that train it (from
    ``root``), with no checkpoint before step 3 (every attempt starts at step 1)."""
    (root / "conf" / "model").mkdir(parents=True)
    (root / "brokenmodel.py").write_text(BROKEN_MODEL)
    (root / "conf" / "model" / "broken.yaml").write_text("_target_: brokenmodel.Broken\nvocab_size: 256\n")
    return ["--config-dir", str(root / "conf"), "model=broken", "data.seq_len=32", "trainer.ckpt_every=100"]
