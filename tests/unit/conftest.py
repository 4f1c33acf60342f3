"""Fixtures of the fast tier, and one intra-op thread per test process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from hpctrain.slurm import commands
from tests.support.fake_slurm import FAKE, Fake

# The fast tier's models are tiny: intra-op threads gain them nothing, and with two xdist workers on two cores
# their spin-waits only slow each other down (several times, on a busy machine).
torch.set_num_threads(1)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    root = tmp_path / "fake"
    root.mkdir()
    for name in ("sacct", "scontrol", "sinfo", "squeue"):
        path = root / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{root}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(root))
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.setattr(commands.time, "sleep", lambda s: None)
    return Fake(root)
