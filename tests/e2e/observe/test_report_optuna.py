"""``hpctrain report`` of an Optuna sweep, as ``status`` and ``summary`` read it: Optuna's sweeper writes no
multirun.yaml, so the report finds the sweep by its sweep.json, or, for a sweep directory written before
sweeps run here had one, by its numbered member runs."""

from __future__ import annotations

from pathlib import Path

from tests.support import hpctrain

# The sweep as typed, packed as a command line reads (a table of overrides).
TRIALS = [
    "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=interval(0.0001,0.01)",
    "trainer.max_steps=2", "data.max_bytes=50000", "trainer.eval_batches=1", "logger=jsonl", "parallel=none",
    "cluster.nproc=1",
]  # fmt: skip


def test_report_reads_an_optuna_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "optuna"
    result = hpctrain(*TRIALS, f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (sweep / "multirun.yaml").exists()  # what report looked for, and refused without
    for found_by in ("sweep.json", "its numbered member runs"):
        out = tmp_path / found_by.replace(" ", "_")
        report = hpctrain("report", str(sweep), "--out", str(out))
        assert report.returncode == 0, (found_by, report.stderr)
        assert f"sweep {sweep}: 2 members" in report.stdout, report.stdout
        assert "optim.lr=" in report.stdout, report.stdout
        assert (out / "final.png").is_file() and (out / "loss.png").is_file()
        (sweep / "sweep.json").unlink(missing_ok=True)  # as a sweep directory of an earlier version
