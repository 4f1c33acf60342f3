"""Issue 43, item 2: ``hpctrain stacks RUN_DIR`` on a live run, and the dump a hang writes by itself. Rank 1
hangs at step 4 (``faults.hang_at``: it sleeps, its heartbeat thread alive) while rank 0 waits for it in the
step's collective: every rank's stack comes back within 5 s, grouped, rank 1's in the fault's sleep. With
the watchdog on, rank 0's watchdog declares the hang and every live rank's stacks land in the run directory
without anyone asking; ``hpctrain status`` names where each stood.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import FAST, REPO, hpctrain, this_checkout_first

RUN = [*FAST, "cluster.nproc=2", "trainer.max_steps=50", "trainer.log_every=1", "trainer.eval_every=0"]


def _wait_for(condition, what: str, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _hanging(run: Path) -> bool:
    log = run / "logs" / "rank1.log"
    return log.exists() and "Hanging at step 4" in log.read_text()


def test_stacks_of_a_live_run_come_back_grouped_within_5_s(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*RUN, "faults.hang_at=1:4", "trainer.watchdog_factor=0", f"hydra.run.dir={run}"]
    launch = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": this_checkout_first()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _hanging(run), "rank 1 to hang at step 4")
        started = time.monotonic()
        shown = hpctrain("stacks", str(run))
        took = time.monotonic() - started
    finally:
        os.killpg(launch.pid, signal.SIGKILL)  # its ranks follow (they die with their launcher)
        launch.wait()
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert took < 5, (took, lines)  # the CLI's own start included
    assert any(line.startswith("rank 1: wait (") for line in lines), lines  # the fault's Event().wait()
    assert any(line.startswith("rank 0: ") and "no answer" not in line for line in lines), lines
    folder = Path(lines[-1].removeprefix("stacks: "))
    assert "in at" in (folder / "rank1.txt").read_text()  # the injection point, from hpctrain/faults
    assert (folder / "rank0.txt").read_text().startswith("Thread MainThread")


def test_a_declared_hang_dumps_every_live_ranks_stacks_by_itself(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*RUN, "faults.hang_at=1:4", "trainer.watchdog_min_s=2", "trainer.watchdog_factor=5"]
    done = hpctrain(*args, "cluster.max_restarts=0", f"hydra.run.dir={run}")
    assert done.returncode != 0, done.stdout[-2000:]
    # Each watchdog that declared the hang asked (rank 0's, waiting in the collective; rank 1's own, over
    # its limit in the fault's sleep), and wrote its own stacks; the other rank answers while it lives.
    folders = [p for p in (run / "stacks").iterdir() if p.is_dir()]
    assert folders and all(p.name.startswith("hang-") for p in folders), folders
    for folder in folders:
        asker = folder.name.rsplit("-", 1)[1]
        assert (folder / f"{asker}.txt").read_text().startswith("Thread MainThread"), folder
    answers = [folder / "rank1.txt" for folder in folders if (folder / "rank1.txt").exists()]
    assert answers and all("in at" in path.read_text() for path in answers), answers
    status = hpctrain("status", str(run))
    line = next((s for s in status.stdout.splitlines() if s.startswith("stacks")), "")
    assert "rank 1: wait (" in line and str(run / "stacks") in line, status.stdout


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
    finished = tmp_path / "done"
    assert hpctrain(*FAST, "trainer.max_steps=2", f"hydra.run.dir={finished}").returncode == 0
    cases = [
        (["stacks"], "RUN_DIR"),
        (["stacks", str(tmp_path / "missing")], "no such run directory"),
        (["stacks", str(tmp_path)], "not a run directory"),
        (["stacks", str(finished)], "the run is not running"),
        (["stacks", str(finished), "--wait", "-1"], "--wait must be between 0 and 3600"),
        (["stacks", str(finished), "--wait", "x"], "--wait"),
        (["stacks", str(tmp_path / "a\x01b")], "no such run directory"),
    ]
    for argv, words in cases:
        shown = hpctrain(*argv)
        assert shown.returncode != 0 and words in shown.stderr, (argv, shown.stderr)
        assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr, shown.stderr
    assert not (finished / "stacks").exists()  # nothing written into a run that was not asked
    assert json.loads((finished / "ranks.json").read_text())
