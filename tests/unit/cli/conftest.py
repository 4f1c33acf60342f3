"""The CLI's fast tests: a folder to type commands in (what a refusal must look like: tests.support.cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.launch.project import PROJECT_DIR_ENV


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder to type the commands in; the environment is restored afterwards."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv(PROJECT_DIR_ENV, str(folder))  # record_project_dir() sets it: undone afterwards
    for name in ("SLURM_CONF", "HPCTRAIN_SLURM_CONFIGLESS"):
        monkeypatch.delenv(name, raising=False)
    return folder
