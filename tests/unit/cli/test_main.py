"""The command line: one table of subcommands drives dispatch, ``hpctrain --help`` and the README's list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.cli import SUBCOMMANDS, main, readme_table
from hpctrain.cli.common import EXIT_USAGE
from tests.support import REPO as ROOT


def test_readme_lists_exactly_the_table() -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- commands -->\n(.*?)<!-- /commands -->", text, re.S)
    assert block is not None, "README.md has no <!-- commands --> block"
    assert block.group(1) == readme_table()


def test_help_lists_every_subcommand_in_one_line_each_and_imports_no_torch() -> None:
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['--help']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    for name, sub in SUBCOMMANDS.items():
        lines = [line for line in result.stdout.splitlines() if f"hpctrain {name} " in line]
        assert len(lines) == 1 and sub.help in lines[0], (name, result.stdout)


def test_every_subcommand_has_a_runner() -> None:
    import importlib

    for name, sub in SUBCOMMANDS.items():
        assert callable(importlib.import_module(f"hpctrain.cli.{sub.module}").run), name


def test_an_unknown_word_is_an_override_refused_in_one_line(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("stauts")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "stauts" in result.stderr, result.stderr


def test_no_subcommand_but_train_imports_torch() -> None:
    """status, logs, plan, ... run on login nodes: their modules (and what they import) leave torch out."""
    names = [name for name in SUBCOMMANDS if name != "train"]
    code = (
        "import contextlib, io, sys; from hpctrain.cli import main\n"
        f"for name in {names!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main([name, '--help']) == 0, name\n"
        "    assert 'torch' not in sys.modules, name\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_help_lists_the_config_groups_and_their_options(capsys) -> None:  # type: ignore[no-untyped-def]
    from hpctrain.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    groups = {line.split()[0]: line for line in out.split("Config groups", 1)[1].splitlines()[1:] if line}
    assert "vit" in groups["model"] and "3d" in groups["parallel"] and "slurm_test" in groups["cluster"]


def test_cfg_job_prints_an_invalid_config_then_what_is_wrong(capsys) -> None:  # type: ignore[no-untyped-def]
    from hpctrain.cli import main

    assert main(["--cfg", "job", "trainer.max_steps=-5"]) == 2
    captured = capsys.readouterr()
    assert "max_steps: -5" in captured.out and "parallel:" in captured.out
    assert captured.err.strip() == "hpctrain: trainer.max_steps=-5: must be ≥ 1"


def test_a_misspelt_key_names_the_nearest_valid_one(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from hpctrain.cli import main

    assert main(["cluster.partiton=gpu", "dry_run=true"]) == 2
    assert "unknown key of cluster; did you mean partition?" in capsys.readouterr().err
    profile = tmp_path / "conf" / "cluster" / "mine.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text(
        "defaults:\n  - /schema/cluster/cluster@_here_\n  - _self_\nname: mine\nkind: slurm\nmax_requeue: 2\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["--config-dir", "conf", "cluster=mine", "dry_run=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain: cluster.max_requeue=2: unknown key in "), err
    assert "mine.yaml; did you mean max_requeues?" in err[0]


def test_hydra_submitit_launcher_is_refused_pointing_to_the_built_in_one(capsys) -> None:  # type: ignore[no-untyped-def]
    from hpctrain.cli import main

    assert main(["-m", "hydra/launcher=submitit_slurm", "cluster=slurm_test", "optim.lr=1e-3,2e-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would submit jobs that submit jobs again" in err[0], err
    assert "-m with a Slurm cluster profile is one job array" in err[0]


def test_a_bad_argument_is_one_line_and_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--no-such-flag"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpctrain status:"), err
