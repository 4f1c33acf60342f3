"""``hpctrain [train]`` (hpctrain.cli.train) and ``python -m hpctrain`` (hpctrain.__main__) in this process:
refusals that come before composing anything, and the module entry point's exit status."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.cli.train import EXIT_BAD_CONFIG


def run(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_what_is_refused_before_composing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    assert run("train", ["--config-dir", "nosuch", "dry_run=true"]) == EXIT_BAD_CONFIG
    assert capsys.readouterr().err == "hpctrain: --config-dir: 'nosuch' is not a directory\n"
    assert run("train", ["-m", "+hydra/launcher=submitit_local", "optim.lr=1e-3,2e-3"]) == EXIT_BAD_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpctrain: hydra/launcher=submitit_local: hydra-submitit")
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_hpctrain_exits_with_mains_status(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "argv", ["hpctrain", "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("hpctrain.__main__", run_name="__main__")
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("usage: hpctrain [OVERRIDES...]")
    monkeypatch.setattr(sys, "argv", ["hpctrain", "trainer.max_steps=abc"])
    with pytest.raises(SystemExit) as refused:
        runpy.run_module("hpctrain.__main__", run_name="__main__")
    assert refused.value.code == 2
    assert capsys.readouterr().err == "hpctrain: trainer.max_steps=abc: expected an integer\n"
