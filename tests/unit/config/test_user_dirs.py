"""A user's own conf/ in composition (hpctrain.config.compose, ``--config-dir`` of hpctrain.cli.common,
``hydra.searchpath``), through the command line in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import CLI
from tests.support.user_project import MINE, make_project


# --- the user's conf/ in composition
@pytest.mark.parametrize("flag", ["--config-dir", "-cd"])
def test_config_dir_adds_the_users_options(cli: CLI, tmp_path: Path, flag: str):
    project = make_project(tmp_path / "proj")
    result = cli(flag, "conf", "cluster=mine", "--cfg", "job", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "name: mine" in result.stdout and "nproc: 1" in result.stdout


def test_config_dir_reaches_the_run(cli: CLI, tmp_path: Path):
    project = make_project(tmp_path / "proj")
    run_dir = tmp_path / "run"
    result = cli(
        "--config-dir",
        "conf",
        "cluster=mine",
        "dry_run=true",
        f"hydra.run.dir={run_dir}",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert "Plan: 1 local process" in result.stdout + result.stderr  # mine.yaml's nproc
    assert not run_dir.exists(), "a dry run writes nothing"
    shown = cli("--config-dir", "conf", "cluster=mine", "--cfg", "job", cwd=project)
    assert shown.returncode == 0 and "name: mine" in shown.stdout, shown.stderr


def test_searchpath_override_works_too(cli: CLI, tmp_path: Path):
    project = make_project(tmp_path / "proj")
    result = cli(f"hydra.searchpath=[file://{project / 'conf'}]", "cluster=mine", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    assert "name: mine" in result.stdout


@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_unknown_option_lists_both_dirs(cli: CLI, tmp_path: Path, how: str):
    project = make_project(tmp_path / "proj")
    args = (
        ["--config-dir", "conf"] if how == "--config-dir" else [f"hydra.searchpath=[file://{project}/conf]"]
    )
    result = cli(*args, "cluster=nosuch", cwd=project)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster=nosuch: unknown option" in lines[0], result.stderr
    assert "mine" in lines[0] and "local" in lines[0]


def test_config_dir_that_is_no_directory_is_refused(cli: CLI, tmp_path: Path):
    (tmp_path / "afile").write_text("")
    for given in ("nosuch", "afile"):
        result = cli("--config-dir", given, "dry_run=true", cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr.strip() == f"hpctrain: --config-dir: '{given}' is not a directory"


def test_an_option_hpctrain_also_has_is_named_unused(cli: CLI, tmp_path: Path):
    project = make_project(tmp_path / "proj")
    (project / "conf" / "cluster" / "local.yaml").write_text(MINE)
    result = cli("-cd", "conf", "cluster=local", "--cfg", "job", cwd=project)
    assert result.returncode == 0, result.stderr
    unused = project / "conf" / "cluster" / "local.yaml"
    assert f"hpctrain: warning: {unused} is not used: hpctrain has an option so named" in result.stderr
    assert "name: local" in result.stdout  # Hydra's order: hpctrain's conf/ first
