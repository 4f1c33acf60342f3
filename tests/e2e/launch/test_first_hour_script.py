"""Issue 29, item 8: ``task=script`` shows rank 0's output on the console (and keeps every rank's in its
log), the script logs metrics in one line (``from hpctrain import log_metrics``) so that ``status`` (without
the trainer's max_steps) and ``report`` read the run, and ``task.args`` reach the script as typed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support import hpctrain

REPO = Path(__file__).resolve().parents[3]
SCRIPT = """
import os, sys
from hpctrain import log_metrics

rank = os.environ["RANK"]
for step in range(1, 5):
    print(f"script step {step} on rank {rank}", flush=True)
    log_metrics(step, loss=1.0 / step, lr=0.1)
print("script args", sys.argv[1:], flush=True)
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return hpctrain(*args, cwd=cwd, timeout=600)


def test_a_script_shows_rank_0_on_the_console_and_logs_metrics_status_and_report_read(tmp_path: Path):
    (tmp_path / "mine.py").write_text(SCRIPT)
    args = [
        "task=script",
        "task.path=mine.py",
        "task.args=[--lr,1e-3,--tag,1.10]",
        "cluster.nproc=2",
        "run=s",
    ]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = result.stdout
    assert all(f"script step {s} on rank 0" in shown for s in range(1, 5)), shown
    assert "on rank 1" not in shown  # rank 1's output is in its log only
    assert "script args ['--lr', '1e-3', '--tag', '1.10']" in shown  # as typed, not 0.001 and 1.1
    run = tmp_path / "outputs" / "s"
    assert "script step 4 on rank 1" in (run / "logs" / "rank1.log").read_text()
    assert "script step 4 on rank 0" in (run / "logs" / "rank0.log").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # rank 0's alone
    status = cli("status", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    lines = dict(line.split(None, 1) for line in status.stdout.splitlines())
    assert lines["state"] == "COMPLETED" and lines["step"] == "4" and lines["loss"] == "0.2500", status.stdout
    report = cli("report", str(run), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (run / "report" / "loss.png").is_file()
