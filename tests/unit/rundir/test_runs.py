"""Runs by their directories (hpctrain.rundir.runs): the command that continues one, and what a run that
never started takes away (itself and the empty folders this command made for it, nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.rundir.runs import continue_command, first_missing, remove_unstarted


def test_continue_command_is_relative_under_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert continue_command(tmp_path / "outputs" / "a b") == "hpctrain resume 'outputs/a b'"
    assert continue_command(Path("/elsewhere/run")) == "hpctrain resume /elsewhere/run"


def test_a_run_that_never_started_goes_with_the_folders_made_for_it(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    run = kept / "new" / "deeper" / "run"
    made = first_missing(run)
    assert made == kept / "new"
    run.mkdir(parents=True)
    remove_unstarted(run, made)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and not any(kept.iterdir())
    assert first_missing(kept) is None
