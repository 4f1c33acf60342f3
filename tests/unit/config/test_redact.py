"""Secrets (hpctrain.config.redact): a ``cluster.env`` value whose name looks secret never reaches a job
script, a sweep directory or the output; launchers pass it through the environment. (That it reaches local
workers unrecorded: tests/e2e/launch/test_secrets.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SLURM = "cluster=slurm_test"


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_secret_env_value_stays_out_of_slurm_job_scripts(cli, tmp_path: Path, launcher: str):  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    result = cli(
        SLURM,
        f"launcher={launcher}",
        "dry_run=true",
        "++cluster.env.WANDB_API_KEY=s3cretvalue",
        "++cluster.env.DB_PASSWORD_FILE=s3cretvalue",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr
    assert "s3cretvalue" not in result.stdout + result.stderr
    assert not run_dir.exists(), "a dry run writes nothing"


def test_launchers_pass_secrets_through_the_environment(monkeypatch: pytest.MonkeyPatch):
    from hpctrain.config.redact import export_secrets, redact_config

    for name in ("HPCTRAIN_TEST_TOKEN", "PLAIN"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # restored to its old state afterwards
    export_secrets({"HPCTRAIN_TEST_TOKEN": "t0k", "PLAIN": "x"})
    assert os.environ["HPCTRAIN_TEST_TOKEN"] == "t0k" and "PLAIN" not in os.environ
    plain = {"cluster": {"env": {"WANDB_API_KEY": "k", "A_SECRET": "s", "HOME2": "h"}}, "x": 1}
    assert redact_config(plain) == {
        "cluster": {
            "env": {"WANDB_API_KEY": "***", "A_SECRET": "***", "HOME2": "h"},
            "secret_env": ["A_SECRET", "WANDB_API_KEY"],
        },
        "x": 1,
    }


def test_secret_env_value_stays_out_of_a_slurm_sweep_directory(cli, tmp_path: Path):  # type: ignore[no-untyped-def]
    sweep = tmp_path / "sweep"
    result = cli(
        "-m",
        SLURM,
        "optim.lr=1e-3,2e-3",
        "dry_run=true",
        "++cluster.env.WANDB_API_KEY=s3cretvalue",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr
    assert "2 members would run (a job array)" in result.stdout
    assert "s3cretvalue" not in result.stdout + result.stderr
    assert not sweep.exists(), "a dry run writes nothing"
