"""``hpctrain report`` (hpctrain.observe.report) on real local runs: the PNGs hold the metrics that
metrics.jsonl recorded; ``status`` and ``summary`` of the local sweep.

One short ViT run (samples/s, val_acc, and MFU against a stated peak) and one local scaling sweep of a tiny
GPT (cluster.nproc=1,2 under DDP: tokens/s). No Slurm.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.cli import main as hpctrain_main
from hpctrain.observe.report import Series, report_sweep, run_pictures
from hpctrain.rundir.records import write_error_record
from tests.support import FAST, REPO, hpctrain, metrics
from tests.support.png import check_png

SHORT = [*FAST, "trainer.max_steps=12", "trainer.log_every=3", "trainer.eval_every=6"]


def main(argv: list[str]) -> int:
    """``hpctrain report ARGV``, in this process."""
    return hpctrain_main(["report", *argv])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("report") / "run"
    result = hpctrain(
        *SHORT,
        "model=vit",
        "data=digits",
        "parallel=none",
        "cluster.nproc=1",
        "cluster.peak_fp32_flops=1e11",  # CPUs have no known peak: stating the fp32 run's makes it log MFU
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("report") / "sweep"
    result = hpctrain("-m", *SHORT, "parallel=ddp", "cluster.nproc=1,2", f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep_dir


def steps_and(records: list[dict], key: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    kept = [r for r in records if r.get(key) is not None]
    return tuple(float(r["step"]) for r in kept), tuple(float(r[key]) for r in kept)


def same(series: Series, steps: tuple[float, ...], ys: tuple[float, ...]) -> bool:
    """The series was drawn at exactly these steps with these values (float32 rounding aside)."""
    return series.x == steps and series.y == pytest.approx(ys)


def test_run_report_draws_the_metrics(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    written = ["loss.png", "throughput.png", "goodput.png"]
    assert out == [f"wrote {run / 'report' / name}" for name in written]

    records = metrics(run)
    assert [r["step"] for r in records] == [3, 6, 9, 12]
    loss, throughput, goodput = run_pictures(run, run / "again")
    assert loss.path == run / "again" / "loss.png"
    for picture in (loss, throughput, goodput):
        check_png(picture)
    train = loss.get("train loss", panel="loss")
    assert same(train, *steps_and(records, "loss"))
    assert train.x == (3.0, 6.0, 9.0, 12.0)
    val = loss.get("val_loss", panel="loss")
    assert val.x == (6.0, 12.0) and val.y == pytest.approx(steps_and(records, "val_loss")[1])
    assert loss.get("val_acc", panel="val_acc").y == pytest.approx(steps_and(records, "val_acc")[1])

    rate = throughput.get("samples/s", panel="throughput")
    assert same(rate, *steps_and(records, "samples_per_s"))
    mfu = throughput.get("MFU", panel="mfu")
    steps, fractions = steps_and(records, "mfu")
    assert mfu.x == steps and mfu.y == pytest.approx([100 * f for f in fractions])

    # Issue 43, item 4: the goodput ledger's stacked bar holds every bucket of goodput.json, end to end.
    ledger = json.loads((run / "goodput.json").read_text())
    drawn = {s.label.rsplit(" ", 1)[0]: s.y[0] for s in goodput.series if s.panel == "goodput"}
    shown = {k: v for k, v in ledger["buckets_s"].items() if v > 0}
    scale = sum(drawn.values()) / ledger["wall_s"]  # drawn in seconds, minutes or hours
    assert drawn.keys() == shown.keys() and scale == pytest.approx(
        1 / 60 ** round(math.log(1 / scale, 60)), rel=0.01
    )
    assert {k: v / scale for k, v in drawn.items()} == pytest.approx(shown, rel=0.01)


def test_scaling_sweep_report(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sweep), "--out", str(tmp_path / "pictures")]) == 0
    out = capsys.readouterr().out
    for name in ("loss", "throughput", "final", "scaling"):
        assert f"wrote {tmp_path / 'pictures' / name}.png" in out
    assert "cluster.nproc=1" in out and "cluster.nproc=2" in out and "efficiency" in out

    report = report_sweep(sweep, tmp_path / "again")
    members = {m.label: m for m in report.members}
    assert set(members) == {"cluster.nproc=1", "cluster.nproc=2"}
    assert [members[k].world_size for k in ("cluster.nproc=1", "cluster.nproc=2")] == [1, 2]
    assert all(m.skipped is None for m in report.members)
    loss, throughput, final, scaling = report.pictures
    assert [p.path.name for p in report.pictures] == [
        "loss.png",
        "throughput.png",
        "final.png",
        "scaling.png",
    ]
    for picture in report.pictures:
        check_png(picture)

    records = {label: metrics(sweep / str(m.index)) for label, m in members.items()}
    for label, member_records in records.items():
        line = loss.get(label, panel="loss")
        assert same(line, *steps_and(member_records, "loss"))
        assert line.x == (3.0, 6.0, 9.0, 12.0)
        val = loss.get(label, panel="val_loss")
        assert same(val, *steps_and(member_records, "val_loss"))
        rate = throughput.get(label, panel="throughput")
        assert same(rate, *steps_and(member_records, "tokens_per_s"))
    labels = ("cluster.nproc=1", "cluster.nproc=2")
    bars = final.get("final loss")
    assert bars.x == labels and bars.y == pytest.approx([records[k][-1]["loss"] for k in labels])
    assert final.get("final val_loss").y == pytest.approx([records[k][-1]["val_loss"] for k in labels])

    # Throughput of a member: the median of its logged windows after the first (the warm-up).
    one, two = (statistics.median(r["tokens_per_s"] for r in records[k][1:]) for k in labels)
    assert scaling.get("ideal", panel="speedup").y == (1.0, 2.0)
    speedup = scaling.get("measured", panel="speedup")
    assert speedup.x == (1.0, 2.0) and speedup.y == pytest.approx([1.0, two / one])
    efficiency = scaling.get("measured", panel="efficiency")
    assert efficiency.y == pytest.approx([100.0, 100 * two / one / 2])
    assert [p.ranks for p in report.scaling] == [1, 2]


def test_failed_and_empty_members_are_listed_and_skipped(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("checkpoints", "report"))
    # Member 2 failed (its rank 0 recorded an error, as the worker does); member 3 never logged a step.
    shutil.copytree(copy / "1", copy / "2")
    write_error_record(copy / "2", 0, "RuntimeError", "injected failure at step 5")
    (copy / "2" / ".hydra" / "overrides.yaml").write_text("- cluster.nproc=2\n- faults.fail_at=0:5\n")
    shutil.copytree(copy / "0", copy / "3")
    (copy / "3" / "metrics.jsonl").unlink()
    (copy / "3" / ".hydra" / "overrides.yaml").write_text("- cluster.nproc=1\n- trainer.seed=7\n")

    assert main([str(copy)]) == 0
    out = capsys.readouterr().out
    listing = out.split("\n#", 1)[1].split("\nranks", 1)[0]  # the member table, before the scaling table
    lines = {line.split()[0]: line for line in listing.splitlines()[1:]}
    assert "skipped: failed: rank 0 on" in lines["2"] and "RuntimeError: injected failure" in lines["2"]
    assert "skipped: no metrics" in lines["3"]
    assert "skipped" not in lines["0"] and "skipped" not in lines["1"]

    report = report_sweep(copy, tmp_path / "again")
    loss = report.pictures[0]
    assert len([s for s in loss.series if s.panel == "loss"]) == 2
    assert {p.ranks for p in report.scaling} == {1, 2}
    assert {tuple(p.members) for p in report.scaling} == {(0,), (1,)}

    for member in ("0", "1"):
        (copy / member / "metrics.jsonl").unlink()
    assert main([str(copy)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hpctrain report: nothing to plot: no member of the sweep has metrics"]


def test_bad_targets(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hpctrain report: {tmp_path}: not a run or sweep directory")
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == f"hpctrain report: {tmp_path / 'missing'}: no such directory"
    assert main([]) == 2
    assert "required" in capsys.readouterr().err

    pending = tmp_path / "pending"  # a run whose workers have not logged a step yet
    pending.mkdir()
    shutil.copy(run / "config.yaml", pending / "config.yaml")
    assert main([str(pending)]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"hpctrain report: {pending}: no metrics yet (no loss in metrics.jsonl)"
    )
    assert not (pending / "report").exists()
    write_error_record(pending, 0, "RuntimeError", "out of memory")
    assert main([str(pending)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"hpctrain report: {pending}: failed before logging a step: rank 0"
    )
    assert err[0].endswith("RuntimeError: out of memory")


def test_report_imports_neither_torch_nor_matplotlib_until_it_draws(run: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from hpctrain.cli import main; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported with the module'; "
        "rc = main(['report', *sys.argv[1:]]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(run), "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "loss.png").is_file() and (tmp_path / "throughput.png").is_file()


def test_the_report_subcommand_of_the_cli(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli-pictures"
    result = hpctrain("report", str(run), "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["goodput.png", "loss.png", "throughput.png"]


def test_status_and_summary_of_a_local_sweep(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 17, item 3: a sweep run here reads like a Slurm array (members, state, step, loss; the table)."""
    from hpctrain.cli import main as cli

    assert cli(["status", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"sweep {sweep}: run here, 2 members (2 COMPLETED)" in out
    assert "cluster.nproc=1" in out and "cluster.nproc=2" in out
    assert cli(["summary", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "best_val_loss" in out and out.count("COMPLETED") == 2
    assert re.search(r"tokens_per_s +ettr\n", out), out  # issue 43, item 4: each member's goodput
    assert (sweep / "summary.csv").read_text().count("\n") == 3
