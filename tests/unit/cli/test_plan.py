"""``hpctrain plan`` (hpctrain.cli.plan) in this process: the exit status says whether the run fits (0),
does not (1) or is a bad config (2, one line, nothing on stdout)."""

from __future__ import annotations

import pytest

from hpctrain.cli import main
from hpctrain.cli.plan import EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT
from tests.support.configs import SEVEN_B


def run(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_the_exit_status_is_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("plan", ["model=gpt", "cluster=a100x32", "--top", "0"]) == 0
    fits = capsys.readouterr().out
    assert "verdict   FITS" in fits
    assert run("plan", [*SEVEN_B, "parallel=ddp", "--top", "2"]) == EXIT_DOES_NOT_FIT
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert run("plan", ["trainer.max_steps=abc"]) == EXIT_BAD_CONFIG
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "hpctrain: trainer.max_steps=abc: expected an integer\n"
