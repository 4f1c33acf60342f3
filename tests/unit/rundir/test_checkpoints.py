"""A run's checkpoint directories (hpctrain.rundir.checkpoints): the manifest names what is missing or
damaged in one line, a manifest of the wrong shape is a problem and not a crash, and a symlinked checkpoint is
never followed out of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.rundir import checkpoints as layout


@pytest.mark.parametrize(
    "manifest",
    ["[]", '{"files": 3}', '{"files": {"a": "big"}}', '{"files": {"../../etc/passwd": 1}}', "{}"],
)
def test_a_manifest_of_the_wrong_shape_is_a_problem_not_a_crash(tmp_path: Path, manifest: str) -> None:
    directory = tmp_path / "step_00000001"
    directory.mkdir()
    (directory / layout.MANIFEST).write_text(manifest)
    problem = layout.problem_with(directory)
    assert problem is not None and "\n" not in problem


def test_a_symlinked_checkpoint_is_not_followed_out_of_the_run(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "step_00000009"
    outside.mkdir(parents=True)
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    (root / "step_00000009").symlink_to(outside, target_is_directory=True)
    assert layout.committed(root) == []


@pytest.mark.parametrize("damage", ["missing-file", "bad-manifest"])
def test_layout_problem_detection(tmp_path: Path, damage: str):
    directory = tmp_path / "step_00000001"
    directory.mkdir()
    (directory / "a.distcp").write_bytes(b"x" * 10)
    layout.write_manifest(directory, 1)
    assert layout.problem_with(directory) is None
    if damage == "missing-file":
        (directory / "a.distcp").unlink()
        assert layout.problem_with(directory) == "a.distcp is missing"
    else:
        (directory / layout.MANIFEST).write_text("{")
        assert "unreadable manifest.json" in str(layout.problem_with(directory))
