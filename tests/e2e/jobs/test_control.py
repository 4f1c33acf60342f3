"""``hpctrain save|stop RUN_DIR`` on a live local run: a checkpoint at the next step boundary and training
goes on; a second request while the first's save is in flight is refused; stop saves and ends the run (exit
0, no requeue), and ``hpctrain status`` says so. Refused in one line: a missing directory, a run that is not
running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, REPO, hpctrain

RUN = [
    *FAST,
    "cluster.nproc=2",
    "trainer.max_steps=100000",
    "trainer.ckpt_every=0",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "faults.save_delay_s=2",  # each save stays in flight 2 s: a window for a second request
]


def last_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_save_then_stop_a_live_local_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    one_line(hpctrain("save", str(tmp_path / "missing")), "no such run directory")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *RUN, f"hydra.run.dir={run}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while last_step(run) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start training"
            time.sleep(0.2)
        asked = hpctrain("save", str(run), "--wait", "0")
        assert asked.returncode == 0 and "asked the run to save" in asked.stdout, asked.stderr
        one_line(hpctrain("stop", str(run)), "request", "in flight")
        saved = hpctrain("save", str(run))  # refused until the first request is answered
        while saved.returncode != 0 and "in flight" in saved.stderr:
            time.sleep(0.5)
            saved = hpctrain("save", str(run))
        assert saved.returncode == 0 and "saved a checkpoint of step" in saved.stdout, saved.stderr
        step = int(saved.stdout.split("of step ")[1].split(";")[0])
        assert (run / "checkpoints" / layout.checkpoint_name(step)).is_dir()
        stopped = hpctrain("stop", str(run))
        assert stopped.returncode == 0 and "and stopped" in stopped.stdout, stopped.stderr
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
        end = int(stopped.stdout.split("of step ")[1].split(" ")[0])
        assert layout.step_of(layout.committed(run / "checkpoints")[0]) == end == last_step(run)
    finally:
        if proc.poll() is None:
            proc.kill()
    status = hpctrain("status", str(run))
    assert "stopped by the user" in status.stdout, status.stdout
    one_line(hpctrain("stop", str(run)), "not running")
