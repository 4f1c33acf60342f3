"""The code snapshot of a Slurm run (hpctrain.launch.snapshot): a git project's tracked files, a plain
folder's sources, the listed paths, refused over the limit or outside the submit directory; a dry run names
it and copies nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.launch import snapshot as snap
from hpctrain.launch.project import PROJECT_DIR_ENV
from hpctrain.launch.snapshot import plan_project, project_path_entry, snapshot_project
from tests.support import CLI, REPO
from tests.support.user_project import MINE, git, make_project


def test_bad_snapshot_path_is_one_line(cli: CLI, tmp_path: Path):
    result = cli(
        "cluster=slurm_test",
        "cluster.snapshot_paths=[../elsewhere]",
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hpctrain: cluster.snapshot_paths=../elsewhere: not a path inside the submit directory"
        " (valid: relative paths without .. or control characters, e.g. [mynets,conf])"
    ]


def test_snapshot_of_a_git_project_holds_its_tracked_files(tmp_path: Path):
    repo = tmp_path / "repo"
    project = make_project(repo / "experiments" / "a")
    (repo / "shared").mkdir()
    (repo / "shared" / "util.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    (project / "untracked.py").write_text("")
    plan = plan_project(project)
    assert plan is not None and plan.root == repo.resolve() and plan.subdir == "experiments/a"
    assert "shared/util.py" in plan.files and "experiments/a/userpkg/nets.py" in plan.files
    assert "experiments/a/untracked.py" not in plan.files
    entry = snapshot_project(plan, tmp_path / "run")
    assert (
        entry
        == tmp_path / "run" / "code" / "project" / "experiments" / "a"
        == project_path_entry(plan, tmp_path / "run")
    )
    assert (entry / "userpkg" / "nets.py").read_text() == "def build():\n    return 42\n"
    assert (entry / "conf" / "cluster" / "mine.yaml").is_file()
    assert (tmp_path / "run" / "code" / "project" / "shared" / "util.py").is_file()
    assert not (entry / "untracked.py").exists()


def test_snapshot_of_a_plain_folder(tmp_path: Path):
    project = make_project(tmp_path / "proj")
    (project / "outputs" / "old").mkdir(parents=True)
    (project / "outputs" / "old" / "big.py").write_text("")
    (project / "userpkg" / "__pycache__").mkdir()
    (project / "userpkg" / "__pycache__" / "nets.cpython-311.pyc").write_text("")
    (project / "notes.txt").write_text("")
    plan = plan_project(project)
    assert plan is not None and plan.subdir == ""
    assert set(plan.files) == {"train_helpers.py", "userpkg/__init__.py", "userpkg/nets.py"}
    listed = plan_project(project, ["userpkg", "conf/cluster", "notes.txt"])
    assert listed is not None
    assert set(listed.files) == {
        "userpkg/__init__.py",
        "userpkg/nets.py",
        "conf/cluster/mine.yaml",
        "notes.txt",
    }
    snapshot_project(listed, tmp_path / "run")
    assert (tmp_path / "run" / "code" / "project" / "conf" / "cluster" / "mine.yaml").read_text() == MINE
    with pytest.raises(ConfigError, match=r"cluster\.snapshot_paths=nosuch: no such file or folder"):
        plan_project(project, ["nosuch"])


def test_snapshot_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    project = make_project(tmp_path / "proj")
    (project / "userpkg" / "weights.py").write_text("x" * 5000)
    monkeypatch.setattr(snap, "PROJECT_LIMIT_BYTES", 4000)
    with pytest.raises(ConfigError) as caught:
        plan_project(project)
    assert "over the 0 MB limit" in str(caught.value) and "cluster.snapshot_paths=[mynets]" in str(
        caught.value
    )
    assert plan_project(project, ["train_helpers.py"]) is not None


def test_a_checkout_of_hpctrain_adds_no_project_snapshot():
    assert plan_project(REPO) is None


def test_slurm_dry_run_from_a_project_names_its_snapshot(cli: CLI, tmp_path: Path):
    project = make_project(tmp_path / "proj")
    run_dir = tmp_path / "run"
    result = cli(
        "-cd",
        "conf",
        "cluster=slurm_test",
        "dry_run=true",
        f"hydra.run.dir={run_dir}",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert f"export PYTHONPATH={run_dir}/code:{run_dir}/code/project${{PYTHONPATH" in out
    assert f"export {PROJECT_DIR_ENV}={project}" in out
    assert not (run_dir / "code").exists()  # a dry run copies nothing


def test_the_package_snapshot_brings_bytecode_its_sources_validate(tmp_path: Path):
    """A job's tasks import the snapshot's compiled modules instead of compiling them each: the package's
    __pycache__ is copied, and each .pyc still matches its copied source (size and modification time, what
    Python checks before using it)."""
    import importlib.util
    import py_compile
    import struct

    import hpctrain
    from hpctrain.launch.snapshot import snapshot_package

    source = Path(hpctrain.__file__).resolve().parent / "errors.py"
    compiled = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(compiled), doraise=True)  # what an import writes there
    code = snapshot_package(tmp_path) / "hpctrain"
    copied_source = code / "errors.py"
    copied = Path(importlib.util.cache_from_source(str(copied_source)))
    assert copied.is_file()
    header = copied.read_bytes()[:16]
    assert header[:4] == importlib.util.MAGIC_NUMBER
    flags, mtime, size = struct.unpack("<III", header[4:16])
    info = copied_source.stat()
    assert flags == 0 and (mtime, size) == (int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)
