"""The check before submission (hpctrain.submit.fits): a run whose estimated memory does not fit a GPU (or
this machine) is refused in one line with its numbers before anything starts; ``plan_check=false`` submits
anyway; a sweep is checked member by member."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.submit.fits import check_fits
from hpctrain.submit.submission import precheck
from tests.support import CLI, refused
from tests.support.configs import SEVEN_B, typed


def test_seven_b_with_ddp_is_refused_in_one_line_with_its_numbers(cli: CLI, tmp_path: Path):
    run_dir = tmp_path / "run"
    result = cli(*SEVEN_B, "parallel=ddp", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("hpctrain: plan: 6.4B-parameter GPT needs 104.1 GiB per GPU"), line
    for words in (
        "params 24.0 GiB + grads 24.0 GiB + optimizer 48.0 GiB",
        "a100x32 has 80 GiB",
        "parallel=",
        "plan_check=false",
    ):
        assert words in line, (words, line)
    assert "Traceback" not in result.stdout + result.stderr
    assert not run_dir.exists(), "a run directory was created, so something started"


def test_seven_b_with_3d_is_accepted_and_the_dry_run_prints_the_plan(cli: CLI, tmp_path: Path):
    # Untied (tied is accepted too: the last stage then holds a copy of the embedding).
    run_dir = tmp_path / "run"
    result = cli(
        *SEVEN_B, "parallel=3d", "model.tie_embeddings=false", "dry_run=true", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr
    assert "plan: fits: " in result.stdout and "GiB per GPU" in result.stdout
    assert "Dry run: nothing submitted." in result.stdout
    assert not (run_dir / "job.json").exists()


def test_plan_check_false_submits_anyway(cli: CLI, tmp_path: Path):
    result = cli(
        *SEVEN_B, "parallel=ddp", "plan_check=false", "dry_run=true", f"hydra.run.dir={tmp_path / 'r'}"
    )
    assert result.returncode == 0, result.stderr
    assert "plan: DOES NOT FIT: 104.1 GiB per GPU" in result.stdout
    assert "Dry run: nothing submitted." in result.stdout


def test_precheck_raises_for_every_sweep_member_that_does_not_fit():
    precheck([*SEVEN_B, "parallel=3d", "model.tie_embeddings=false", "dry_run=true"], multirun=False)
    with pytest.raises(ConfigError, match=r"^plan: 6\.4B-parameter GPT needs"):
        precheck([*SEVEN_B, "parallel=3d,ddp", "model.tie_embeddings=false", "dry_run=true"], multirun=True)
    with pytest.raises(ConfigError) as caught:
        check_fits(typed(*SEVEN_B, "parallel=ddp"))
    assert "\n" not in str(caught.value)


def test_a_model_larger_than_this_machine_is_refused_before_it_starts(cli: CLI, tmp_path: Path):
    run = tmp_path / "run"
    big = ["model.d_model=8192", "model.n_heads=64", "model.n_layers=48", "cluster.nproc=2"]
    line = refused(cli(*big, f"hydra.run.dir={run}"), ["GiB per process", "this machine", "plan_check"])
    assert "× 2 processes" in line
    assert not run.exists()
