"""``hpctrain report`` (hpctrain.cli.report, hpctrain.observe.report, hpctrain.observe.results) on a run and
a sweep written by hand, in this process: the pictures hold the logged numbers, a failed member is listed and
skipped, the scaling table compares world sizes; a target that is not a run is one line. (On real runs:
tests/e2e/observe/test_report.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.observe.report import run_pictures
from hpctrain.observe.results import steady_throughput, throughput_key, world_size
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import write_error_record
from tests.support import CLI
from tests.support.png import check_png
from tests.support.runs import local_run, local_sweep, steps


def report_main(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_a_runs_pictures_hold_its_metrics(tmp_path: Path) -> None:
    records = steps(4, samples_per_s=20.0, mfu=0.01)
    records[1]["val_loss"], records[3]["val_loss"] = 1.5, 1.25
    run = local_run(tmp_path / "run", ["model=vit", "data=digits", "trainer.max_steps=4"], records)
    loss, throughput = run_pictures(run, None)
    assert [loss.path, throughput.path] == [run / "report" / "loss.png", run / "report" / "throughput.png"]
    for picture in (loss, throughput):
        check_png(picture)
    assert loss.get("train loss", panel="loss").y == pytest.approx([r["loss"] for r in records])
    assert loss.get("val_loss", panel="loss").x == (2.0, 4.0)
    assert throughput.get("MFU", panel="mfu").y == pytest.approx([1.0] * 4)  # percent


def test_a_runs_evaluations_are_a_picture_of_their_own(tmp_path: Path) -> None:
    run = local_run(tmp_path / "run", ["trainer.max_steps=4"], steps(4))
    assert [p.path.name for p in run_pictures(run, None)] == ["loss.png"]  # no evaluation: no eval.png
    evals = [
        (2, {"val_loss": 2.5}, 1.0),
        (4, {"val_loss": 2.0, "bleu": 0.5}, 2.0),
        (2, {"val_loss": 2.25}, 3.0),
    ]
    for step, metrics, when in evals:
        RunDir(run).append_eval({"step": step, **metrics, "eval_s": 1.0, "time": when, "host": "h"})
    *_, picture = run_pictures(run, None)
    assert picture.path == run / "report" / "eval.png"
    check_png(picture)
    val = picture.get("val_loss", panel="eval:val_loss")
    assert val.x == (2.0, 4.0) and val.y == pytest.approx([2.25, 2.0])  # step 2 evaluated again: its latest
    assert picture.get("bleu", panel="eval:bleu").x == (4.0,)
    assert {s.label for s in picture.series} == {"val_loss", "bleu"}  # eval_s, time, host: no metrics


def test_a_scaling_sweep_with_a_failed_member(cli: CLI, tmp_path: Path) -> None:
    members = [(1, 100.0), (2, 180.0), (2, 0.0)]
    local_sweep(
        tmp_path,
        [(["trainer.max_steps=3", f"cluster.nproc={n}"], steps(3, tokens_per_s=rate)) for n, rate in members],
    )
    write_error_record(tmp_path / "2", 0, "RuntimeError", "injected failure at step 2")
    shown = cli("report", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"sweep {tmp_path}: 3 members" and lines[1] == "common overrides: trainer.max_steps=3"
    member = {line.split()[0]: line for line in lines if line[:1].isdigit() and "cluster.nproc" in line}
    assert "skipped: failed: rank 0 on" in member["2"] and "skipped" not in member["0"] + member["1"]
    scaling = lines[lines.index(next(line for line in lines if line.startswith("ranks"))) + 1 :][:2]
    assert scaling[0].split() == ["1", "100", "1.00", "1", "100%"]
    assert scaling[1].split() == ["2", "180", "1.80", "2", "90%"]  # speedup 180/100, efficiency 1.8/2
    assert [
        f"wrote {tmp_path / 'report' / n}.png" for n in ("loss", "throughput", "final", "scaling")
    ] == lines[-4:]
    assert world_size(tmp_path / "1") == 2 and throughput_key(steps(1, tokens_per_s=1.0)) == "tokens_per_s"
    assert steady_throughput(steps(3, tokens_per_s=5.0), "tokens_per_s") == 5.0


def test_targets_that_are_not_runs_are_one_line(cli: CLI, tmp_path: Path) -> None:
    nothing = cli("report", str(tmp_path))
    assert nothing.returncode == 2 and nothing.stderr.startswith(
        f"hpctrain report: {tmp_path}: not a run or sweep"
    )
    assert (
        cli("report", str(tmp_path / "missing")).stderr
        == f"hpctrain report: {tmp_path / 'missing'}: no such directory\n"
    )
    assert report_main("report", []) == 2  # no target: argparse's usage error, one line
