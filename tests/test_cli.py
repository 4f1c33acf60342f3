"""The command line: one table of subcommands drives dispatch, ``hpctrain --help`` and the README's list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from hpctrain.cli import SUBCOMMANDS, readme_table

ROOT = Path(__file__).resolve().parents[1]


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


def test_an_unknown_word_is_an_override_refused_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain", "stauts"], capture_output=True, text=True, cwd=ROOT
    )
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
