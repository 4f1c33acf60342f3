"""Golden files (submitit's habit): a job script rendered for one fixed config, compared byte for byte with
tests/unit/launch/golden/NAME. ``HPCTRAIN_UPDATE_GOLDEN=1`` rewrites them; review the diff, then commit."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import pytest

from hpctrain.launch.project import PROJECT_DIR_ENV

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "launch" / "golden"
# The options a site sets most, so that a change to how any of them is rendered shows in a diff.
GOLDEN_CLUSTER = [
    "cluster=a100x32",
    "cluster.account=proj",
    "cluster.qos=high",
    "cluster.exclude='gpu[01-03]'",
    "cluster.mail_type=END",
    "cluster.mail_user=me@example.org",
    "cluster.additional.comment=golden",
    "++cluster.env.WANDB_MODE=offline",
    "++cluster.env.WANDB_API_KEY=not-written",
    "cluster.setup=['module load cuda/12.4']",
]
GOLDEN_RUNS = {
    "srun": [*GOLDEN_CLUSTER, "launcher=sbatch", "cluster.sbatch_template=srun"],
    "torchrun": [*GOLDEN_CLUSTER, "launcher=sbatch", "cluster.sbatch_template=torchrun"],
    "srun-container": [
        "cluster=a100x32",
        "launcher=sbatch",
        "cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3'",
        "cluster.container_mounts=[/data:/data:ro]",
    ],
}
GOLDEN_RUN_DIR = Path("/scratch/me/outputs/golden")
GOLDEN_SUBMIT_DIR = "/home/me/project"


def golden_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A submit directory holding a user's package (so the project's copy goes on PYTHONPATH too)."""
    project = tmp_path / "project"
    (project / "mynets").mkdir(parents=True)
    (project / "mynets" / "__init__.py").write_text("")
    monkeypatch.setenv(PROJECT_DIR_ENV, str(project))
    return project


def as_golden(text: str, project: Path) -> str:
    """What differs between machines replaced: the submitting interpreter and the submit directory."""
    return text.replace(sys.executable, "/usr/bin/python3").replace(str(project), GOLDEN_SUBMIT_DIR)


def check_golden(name: str, text: str) -> None:
    """``text`` equals tests/unit/launch/golden/NAME; HPCTRAIN_UPDATE_GOLDEN=1 writes it instead (review the
    diff before committing it)."""
    path = GOLDEN / name
    if os.environ.get("HPCTRAIN_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"{path} is missing: HPCTRAIN_UPDATE_GOLDEN=1 writes it"
    expected = path.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), name))
    assert text == expected, (
        f"the rendering differs from {path} (HPCTRAIN_UPDATE_GOLDEN=1 rewrites it):\n{diff}"
    )
