"""``hpctrain status | summary | cancel`` (hpctrain.cli.jobs) on runs and sweeps run here, written by hand
(tests/support/runs.py), in this process: a run's step and loss, a sweep's members and their states, the
summary table and its CSV; a local run cannot be cancelled from here. (Slurm jobs:
tests/slurm/test_jobs.py.)"""

from __future__ import annotations

import csv
from pathlib import Path

from hpctrain.cli import main
from hpctrain.rundir.records import write_error_record
from tests.support import CLI
from tests.support.runs import local_run, steps


def jobs_main(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def fields(output: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in output.splitlines() if line[:1].strip())


def test_status_of_a_local_run_and_of_one_that_failed(cli: CLI, tmp_path: Path) -> None:
    run = local_run(tmp_path / "run", ["trainer.max_steps=5"], [*steps(4), {"step": 4, "val_loss": 1.25}])
    shown = cli("status", str(run))
    assert shown.returncode == 0, shown.stderr
    assert fields(shown.stdout) == {
        "run": str(run),
        "state": "STOPPED",
        "step": "4/5",
        "loss": "0.5000",
        "val_loss": "1.2500 (step 4)",
        "continue": f"hpctrain resume {run}",
    }
    write_error_record(run, 1, "ValueError", "bad batch", trace="Traceback ...\nValueError: bad batch\n")
    shown = cli("status", str(run))
    assert shown.returncode == 1  # a failed run
    failed = fields(shown.stdout)
    assert failed["error"].startswith("rank 1 on ") and failed["error"].endswith("ValueError: bad batch")


def test_status_summary_and_cancel_of_a_sweep_run_here(cli: CLI, tmp_path: Path) -> None:
    for i, lr in enumerate(("0.1", "0.2")):
        local_run(tmp_path / str(i), ["trainer.max_steps=3", f"optim.lr={lr}"], steps(3))
    shown = cli("status", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert f"sweep {tmp_path}: run here, 2 members (2 COMPLETED)" in shown.stdout
    assert "optim.lr=0.1" in shown.stdout and "optim.lr=0.2" in shown.stdout
    summary = cli("summary", str(tmp_path))
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.splitlines()[1] == "common overrides: trainer.max_steps=3"
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["index"], r["state"], r["step"], r["overrides"]) for r in rows] == [
        ("0", "COMPLETED", "3", "trainer.max_steps=3 optim.lr=0.1"),
        ("1", "COMPLETED", "3", "trainer.max_steps=3 optim.lr=0.2"),
    ]
    assert cli("summary", str(tmp_path), "--csv", str(tmp_path / "nowhere" / "x.csv")).returncode == 1
    stopped = cli("cancel", str(tmp_path / "0"))
    # issue 41: the wrong command for a run here (a usage error, 2) names the one that stops it
    assert stopped.returncode == 2
    member = tmp_path / "0"
    assert stopped.stderr == (
        f"hpctrain cancel: {member} is a local run (no job.json): stop it with hpctrain stop {member}\n"
    )


def test_bad_arguments_are_one_line(cli: CLI, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for args, code, message in [
        (["status", "--no-such-flag"], 2, None),
        (
            ["status", str(tmp_path / "empty")],
            1,
            f"hpctrain status: {tmp_path / 'empty'}: not a run or sweep "
            "directory (no job.json, sweep.json or metrics.jsonl)\n",
        ),
        (["summary", str(tmp_path / "empty")], 1, None),
    ]:
        result = cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
        if message is not None:
            assert result.stderr == message
    assert jobs_main("status", ["--help"]) == 0
