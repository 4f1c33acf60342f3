"""One row per sweep member (hpctrain.jobs.summary): the step reached, the last loss, the best and last
validation numbers, throughput as the median over logged steps; columns for what some member logged."""

from __future__ import annotations

from pathlib import Path

from hpctrain.jobs.summary import last_with, progress, summary_rows, sweep_states
from hpctrain.jobs.targets import resolve
from tests.support.runs import local_run, steps


def test_rows_of_a_sweep_run_here(tmp_path: Path) -> None:
    first = steps(4, tokens_per_s=100.0)
    first[0]["tokens_per_s"] = 1.0  # the warm-up step: the median leaves it out
    first[1]["val_loss"], first[3]["val_loss"] = 3.0, 3.5
    local_run(tmp_path / "0", ["trainer.max_steps=4", "optim.lr=0.1"], first)
    local_run(tmp_path / "1", ["trainer.max_steps=4", "optim.lr=0.2"], steps(2, tokens_per_s=50.0))
    sweep = resolve(str(tmp_path)).sweep
    assert sweep is not None
    columns, rows = summary_rows(sweep, sweep_states(sweep))
    assert columns == [
        "index",
        "overrides",
        "job_id",
        "state",
        "step",
        "loss",
        "best_val_loss",
        "last_val_loss",
        "tokens_per_s",
        "run_dir",
    ]
    assert rows[0]["state"] == "COMPLETED" and rows[1]["state"] == "STOPPED"
    assert (rows[0]["step"], rows[0]["loss"]) == (4, 0.5) and rows[0]["tokens_per_s"] == 100.0
    assert (rows[0]["best_val_loss"], rows[0]["last_val_loss"]) == (3.0, 3.5)
    assert rows[1]["best_val_loss"] is None and rows[1]["overrides"] == "trainer.max_steps=4 optim.lr=0.2"
    assert progress(tmp_path / "0", first) == "4/4" and progress(tmp_path / "1", []) == "-/4"
    assert last_with(first, "val_loss") == first[3]
