"""``hpctrain resume`` (hpctrain.cli.resume): what it cannot continue is one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.cli.resume import EXIT_BAD_CONFIG


def run(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_resume_of_what_is_not_a_run_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run("resume", []) == EXIT_BAD_CONFIG  # no RUN_DIR and no run under ./outputs or ./multirun
    assert run("resume", [str(tmp_path / "missing")]) == EXIT_BAD_CONFIG
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("hpctrain: RUN_DIR") for line in err), err
