"""A submission (hpctrain.submit.submission): the implied overrides resolved in one phase, then one ordered
table of checks, whose order is what a user sees as the one line when several things are wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.submit import submission
from hpctrain.submit.submission import precheck

ORDER = [
    "config",
    "model and data",
    "precision",
    "this shell",
    "probe and fits",
    "site",
    "shadowed options",
    "run directory",
]
WHOLE = ["sweep name", "pack", "evaluation jobs", "snapshot", "partitions"]


def test_the_checks_run_in_the_order_of_the_table():
    assert [stage.name for stage in submission.STAGES] == ORDER
    assert [whole.name for whole in submission.WHOLE] == WHOLE
    assert all(stage.what and "\n" not in stage.what for stage in [*submission.STAGES, *submission.WHOLE])


def _refusal(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        precheck(list(overrides), multirun=False)
    return caught.value


def test_the_first_stage_that_refuses_is_the_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Inputs wrong at two stages at once: the earlier stage of the table speaks."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    bad_dir = f"hydra.run.dir={a_file}"  # the run directory stage refuses it (a file, not a folder)
    assert _refusal([bad_dir]).key == "hydra.run.dir"
    # config before the run directory
    assert _refusal(["trainer.max_steps=-1", bad_dir]).key == "trainer.max_steps"
    # the model and its data before the run directory: a ViT fed text the user chose
    assert _refusal(["model=vit", "data=text", bad_dir]).key.startswith("data")
    # the site (a Slurm client here) before the run directory
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    assert _refusal(["cluster=slurm_test", bad_dir]).key == "cluster"


def test_what_the_first_run_implies_is_added_once_and_said_after_the_checks(
    capsys: pytest.CaptureFixture[str],
):
    overrides = ["model=vit", "dry_run=true"]
    first, _ = precheck(overrides, multirun=False)
    chosen = [o for o in overrides if o.startswith("data=")]
    assert len(chosen) == 1 and first.data.name == chosen[0].split("=", 1)[1], overrides
    said = capsys.readouterr().out.splitlines()
    assert said == [f"hpctrain: {chosen[0]} (model ViT takes images; choose another with data=...)"], said
    overrides = ["model=vit", "hydra.run.dir=/proc/none"]  # refused: nothing said
    with pytest.raises(ConfigError):
        precheck(overrides, multirun=False)
    assert capsys.readouterr().out == ""


def test_a_grids_dry_run_lists_its_members(
    capsys: pytest.CaptureFixture,
):
    from hpctrain.submit.dry_run import list_dry_sweep

    overrides = ["optim.lr=1e-3,3e-4", "dry_run=true"]
    first, composed = precheck(overrides, multirun=True)
    assert list_dry_sweep(overrides, composed, first) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Dry run: nothing started. 2 members would run (one after another here) in ")
    assert out[1:] == ["  0  optim.lr=0.001 dry_run=true", "  1  optim.lr=0.0003 dry_run=true"], out
