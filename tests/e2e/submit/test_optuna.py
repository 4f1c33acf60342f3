"""Optuna's sweeper on local runs (hpctrain.submit.hydra_app, hpctrain.launch.array): each trial's final
validation loss is its objective."""

from __future__ import annotations

from pathlib import Path

from tests.support import hpctrain


def test_optuna_sweeper_runs_locally(tmp_path: Path) -> None:
    """Optuna's sweeper on local runs: each trial's final validation loss is its objective."""
    import json

    sweep = tmp_path / "optuna"
    result = hpctrain(
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "optim.lr=interval(0.0001,0.01)",
        "trainer.max_steps=2",
        "data.max_bytes=50000",
        "logger=jsonl",
        "parallel=none",
        "cluster.nproc=1",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    finals = []
    for member in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        records = [json.loads(line) for line in (member / "metrics.jsonl").read_text().splitlines()]
        finals.append(records[-1]["val_loss"])
    assert len(finals) == 2 and f"Best value: {min(finals)}" in result.stdout
