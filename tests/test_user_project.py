"""A user's own project folder: its conf/ reaches composition (--config-dir, hydra.searchpath) and its code
reaches every worker (PYTHONPATH locally, the code snapshot on Slurm). No Slurm cluster is needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, hpctrain

from hpctrain.errors import ConfigError
from hpctrain.launch import snapshot as snap
from hpctrain.launch.jobscript import setup_lines
from hpctrain.launch.project import PROJECT_DIR_ENV, package_path_entry, worker_pythonpath
from hpctrain.launch.snapshot import plan_project, project_path_entry, snapshot_project

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


# --- the user's conf/ in composition
@pytest.mark.parametrize("flag", ["--config-dir", "-cd"])
def test_config_dir_adds_the_users_options(tmp_path: Path, flag: str):
    project = make_project(tmp_path / "proj")
    result = hpctrain(flag, "conf", "cluster=mine", "--cfg", "job", cwd=project, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "name: mine" in result.stdout and "nproc: 1" in result.stdout


def test_config_dir_reaches_the_run(tmp_path: Path):
    project = make_project(tmp_path / "proj")
    run_dir = tmp_path / "run"
    result = hpctrain(
        "--config-dir",
        "conf",
        "cluster=mine",
        "dry_run=true",
        f"hydra.run.dir={run_dir}",
        cwd=project,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Plan: 1 local process" in result.stdout + result.stderr  # mine.yaml's nproc
    assert not run_dir.exists(), "a dry run writes nothing"
    shown = hpctrain("--config-dir", "conf", "cluster=mine", "--cfg", "job", cwd=project, timeout=60)
    assert shown.returncode == 0 and "name: mine" in shown.stdout, shown.stderr


def test_searchpath_override_works_too(tmp_path: Path):
    project = make_project(tmp_path / "proj")
    result = hpctrain(
        f"hydra.searchpath=[file://{project / 'conf'}]", "cluster=mine", "--cfg", "job", timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "name: mine" in result.stdout


@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_unknown_option_lists_both_dirs(tmp_path: Path, how: str):
    project = make_project(tmp_path / "proj")
    args = (
        ["--config-dir", "conf"] if how == "--config-dir" else [f"hydra.searchpath=[file://{project}/conf]"]
    )
    result = hpctrain(*args, "cluster=nosuch", cwd=project, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster=nosuch: unknown option" in lines[0], result.stderr
    assert "mine" in lines[0] and "local" in lines[0]


def test_config_dir_that_is_no_directory_is_refused(tmp_path: Path):
    (tmp_path / "afile").write_text("")
    for given in ("nosuch", "afile"):
        result = hpctrain("--config-dir", given, "dry_run=true", cwd=tmp_path, timeout=60)
        assert result.returncode == 2
        assert result.stderr.strip() == f"hpctrain: --config-dir: '{given}' is not a directory"


def test_bad_snapshot_path_is_one_line(tmp_path: Path):
    result = hpctrain(
        "cluster=slurm_test",
        "cluster.snapshot_paths=[../elsewhere]",
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hpctrain: cluster.snapshot_paths=../elsewhere: not a path inside the submit directory"
        " (valid: relative paths without .. or control characters, e.g. [mynets,conf])"
    ]


# --- the user's code on every worker
def test_local_workers_get_the_project_after_hpctrain(tmp_path: Path):
    path = worker_pythonpath(tmp_path, "/else:/where").split(os.pathsep)
    assert path[-3:] == [str(tmp_path), "/else", "/where"]
    assert str(package_path_entry()) in path  # this checkout is no site-packages directory
    assert path.index(str(package_path_entry())) < path.index(str(tmp_path))
    assert worker_pythonpath(tmp_path, None, first=[Path("/a")]) == os.pathsep.join(["/a", str(tmp_path)])


def test_slurm_setup_lines_put_the_project_after_the_package(tmp_path: Path):
    from hpctrain.config.schema import ClusterConfig

    lines = setup_lines(ClusterConfig(), tmp_path / "code", tmp_path / "code" / "project" / "sub", tmp_path)
    assert (
        lines[0]
        == f"export PYTHONPATH={tmp_path}/code:{tmp_path}/code/project/sub${{PYTHONPATH:+:$PYTHONPATH}}"
    )
    assert f"export {PROJECT_DIR_ENV}={tmp_path}" in lines


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


def test_slurm_dry_run_from_a_project_names_its_snapshot(tmp_path: Path):
    project = make_project(tmp_path / "proj")
    run_dir = tmp_path / "run"
    result = hpctrain(
        "-cd",
        "conf",
        "cluster=slurm_test",
        "dry_run=true",
        f"hydra.run.dir={run_dir}",
        cwd=project,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert f"export PYTHONPATH={run_dir}/code:{run_dir}/code/project${{PYTHONPATH" in out
    assert f"export {PROJECT_DIR_ENV}={project}" in out
    assert not (run_dir / "code").exists()  # a dry run copies nothing


def test_an_option_hpctrain_also_has_is_named_unused(tmp_path: Path):
    project = make_project(tmp_path / "proj")
    (project / "conf" / "cluster" / "local.yaml").write_text(MINE)
    result = hpctrain("-cd", "conf", "cluster=local", "--cfg", "job", cwd=project, timeout=60)
    assert result.returncode == 0, result.stderr
    unused = project / "conf" / "cluster" / "local.yaml"
    assert f"hpctrain: warning: {unused} is not used: hpctrain has an option so named" in result.stderr
    assert "name: local" in result.stdout  # Hydra's order: hpctrain's conf/ first
