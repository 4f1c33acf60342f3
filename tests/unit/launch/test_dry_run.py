"""A dry run of each launcher (local, sbatch, a local sweep) prints the plan and the rendered submission and
leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "printed"),
    [
        (["dry_run=true"], "Plan: 2 local processes"),
        (["dry_run=true", "cluster=slurm_test", "launcher=sbatch"], "#SBATCH --nodes=2"),
        (["-m", "optim.lr=1e-3,2e-3", "dry_run=true"], "2 members would run (one after another here)"),
    ],
    ids=["local", "sbatch", "local sweep"],
)
def test_dry_run_prints_the_plan_and_leaves_nothing_behind(
    cli, tmp_path: Path, args: list[str], printed: str
):  # type: ignore[no-untyped-def]
    """Issue 17, item 6: a dry run prints the plan and the rendered submission, and creates no directory or
    file (not the run or sweep directory, nor Hydra's .hydra/ or log file)."""
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert printed in result.stdout
    assert list(tmp_path.iterdir()) == [], "a dry run wrote something"
