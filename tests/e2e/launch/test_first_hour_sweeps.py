"""Issue 29, item 9: the Optuna sweeper's documented forms of a search space work:
``hydra.sweeper.params={...}`` on the command line, ``params:`` in a config of the user's,
``tag(log, interval(...))`` and ``choice``; a dry run of such a sweep says what it would do in two lines and
leaves nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import hpctrain

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")

REPO = Path(__file__).resolve().parents[3]
# A short run, packed as a command line reads (a table of overrides).
SHORT = ["trainer.max_steps=2", "data.max_bytes=60000", "logger=jsonl", "parallel=none", "cluster.nproc=1",
         "model.n_layers=1", "trainer.eval_batches=1"]  # fmt: skip
EXPERIMENT = """# @package _global_
defaults:
  - override /hydra/sweeper: optuna
hydra:
  sweeper:
    n_trials: 1
    params:
      optim.lr: tag(log, interval(1e-4, 1e-2))
      trainer.micro_batch_size: choice(8, 16)
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return hpctrain(*args, cwd=cwd, timeout=600)


def test_the_params_mapping_on_the_command_line_runs_its_trials(tmp_path: Path):
    result = cli(
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=1",
        'hydra.sweeper.params={optim.lr:"interval(1e-4,1e-2)"}',
        *SHORT,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Best parameters: {'optim.lr':" in result.stdout + result.stderr
    (member,) = [p for p in next((tmp_path / "multirun").glob("*/*")).iterdir() if p.name.isdigit()]
    assert (member / "metrics.jsonl").is_file()


def test_params_in_a_config_and_a_dry_run_of_a_sampler_sweep(tmp_path: Path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "lr.yaml").write_text(EXPERIMENT)
    dry = cli("-m", "--config-dir", "conf", "+experiment=lr", *SHORT, "dry_run=true", cwd=tmp_path)
    assert dry.returncode == 0 and "Traceback" not in dry.stderr, dry.stderr
    lines = dry.stdout.strip().splitlines()
    assert lines[0].startswith("Dry run: nothing started. hydra/sweeper=optuna would run 1 trials"), (
        dry.stdout
    )
    assert "optim.lr=tag(log, interval(1e-4, 1e-2))" in lines[1] and "choice(8, 16)" in lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]
    real = cli("-m", "--config-dir", "conf", "+experiment=lr", *SHORT, cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    assert "Best parameters:" in real.stdout + real.stderr
