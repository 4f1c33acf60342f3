"""``hpctrain report`` on a sweep that ran as one job array on the real test cluster: the members that
completed are drawn, those that failed are listed as FAILED and left out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hpctrain.observe.report import report_sweep
from hpctrain.rundir.records import read_sweep
from tests.support import REPO, metrics
from tests.support.png import check_png

from .conftest import Submitted
from .test_submit import wait_final


def test_report_of_a_slurm_sweep(slurm_sweep: Submitted, tmp_path: Path) -> None:
    """The sweep (conftest.py, shared with test_submit.py): lr=1e-3,3e-3 × faults.fail_at=null,'1:5', 12 steps
    logged every 3."""
    sweep = slurm_sweep.run
    record = read_sweep(sweep)
    assert record is not None and len(record.members) == 4
    states = wait_final([m.job_id for m in record.members])
    failing = {m.index for m in record.members if "faults.fail_at='1:5'" in m.overrides}
    assert len(failing) == 2
    expected = {m.job_id: "FAILED" if m.index in failing else "COMPLETED" for m in record.members}
    assert {job: s.state for job, s in states.items()} == expected

    report = subprocess.run(
        [sys.executable, "-m", "hpctrain", "report", str(sweep)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert "Slurm states unknown" not in report.stderr
    for name in ("loss", "throughput", "final"):
        assert f"wrote {sweep / 'report' / name}.png" in report.stdout
    assert not (sweep / "report" / "scaling.png").exists()  # one array, one shape: no scaling sweep
    rows = {int(line.split()[0]): line for line in report.stdout.splitlines() if line[:1].isdigit()}
    for index in range(4):
        if index in failing:
            assert "skipped: FAILED: rank 1 on node" in rows[index], report.stdout
            assert "RuntimeError: injected failure at step 5" in rows[index]
        else:
            assert "skipped" not in rows[index] and "12/12" in rows[index], report.stdout

    drawn = report_sweep(sweep, tmp_path / "again")
    loss, throughput, final = drawn.pictures
    for picture in drawn.pictures:
        check_png(picture)
    completed = [m for m in drawn.members if m.index not in failing]
    assert {m.label for m in completed} == {
        "optim.lr=0.001 faults.fail_at=null",
        "optim.lr=0.003 faults.fail_at=null",
    }
    assert len([s for s in loss.series if s.panel == "loss"]) == 2
    for done in completed:
        assert done.state == "COMPLETED"
        records = metrics(done.run_dir)
        line = loss.get(done.label, panel="loss")
        assert line.x == (3.0, 6.0, 9.0, 12.0)
        assert list(line.y) == [float(r["loss"]) for r in records]
        assert throughput.get(done.label).y == tuple(float(r["tokens_per_s"]) for r in records)
    assert final.get("final loss").x == tuple(m.label for m in completed)

    # The sweep directory copied off the cluster, read without asking Slurm: sweep.json's absolute paths
    # point at the original, the members are read from beside the copy, and the ranks' error records tell
    # the failed ones.
    copy = tmp_path / "copied"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("code", "checkpoints", "report"))
    offline = report_sweep(copy, ask_slurm=False)
    assert [m.run_dir.parent for m in offline.members] == [copy] * 4
    for judged in offline.members:
        if judged.index in failing:
            assert judged.skipped is not None and judged.skipped.startswith("failed: rank 1 on node")
        else:
            assert judged.skipped is None and judged.state is None
    assert [p.path for p in offline.pictures] == [
        copy / "report" / f"{n}.png" for n in ("loss", "throughput", "final")
    ]
