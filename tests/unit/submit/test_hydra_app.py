"""How a checked run goes through Hydra (hpctrain.submit.hydra_app), in this process: ``--cfg`` of a config
that composes but does not validate prints it as composed (nothing for one that cannot compose); a dry run
prints the plan and writes nothing; a single run's task reuses the precheck's typed config unless a run key
interpolates."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config.compose import compose
from hpctrain.submit.hydra_app import _interpolates, print_composed
from tests.support import CLI


def test_cfg_prints_the_config_as_composed(capsys: pytest.CaptureFixture[str]) -> None:
    print_composed(["trainer.max_steps=-5"], [], "job")
    job = capsys.readouterr().out
    assert "max_steps: -5" in job and "hydra:" not in job
    print_composed(["trainer.max_steps=-5"], [], "hydra")
    assert capsys.readouterr().out.startswith("hydra:")
    print_composed(["model=nosuch"], [], "all")  # cannot compose: the error line says why, elsewhere
    assert capsys.readouterr().out == ""


def test_a_dry_run_prints_and_writes_nothing(cli: CLI, tmp_path: Path) -> None:
    result = cli("dry_run=true", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plan: ") and "Dry run: nothing started." in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_only_a_run_key_that_interpolates_is_typed_again() -> None:
    """run_single hands the task the precheck's typed config unless a run key holds ``${...}`` (resolved anew
    inside Hydra's run: ``${now:...}`` a moment later, ``${hydra:...}`` once Hydra has set it)."""
    plain = compose(["trainer.max_steps=3"])
    assert [key for key in plain if key != "hydra" and _interpolates(plain._get_node(key))] == []
    assert _interpolates(plain._get_node("hydra"))  # outputs/${now:...}: never among the run keys checked
    linked = compose(["trainer.max_steps=${optim.warmup_steps}"])
    assert [key for key in linked if key != "hydra" and _interpolates(linked._get_node(key))] == ["trainer"]
    assert not _interpolates(None) and not _interpolates(linked._get_node("model"))
