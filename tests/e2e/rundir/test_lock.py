"""One run per run directory: a second run is refused in one line naming the holder; the OS frees the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.rundir import RunDir
from tests.support import CLI, FAST, REPO


def test_second_run_in_the_same_directory_is_refused_until_the_first_dies(cli: CLI, run_dir: Path):
    first = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *FAST, "trainer.max_steps=100000", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = RunDir(run_dir).lock
        deadline = time.monotonic() + 60
        while not (lock.is_file() and lock.read_text().strip()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.1)
        assert json.loads(lock.read_text())["pid"] == first.pid

        # The second and third commands in this process: the lock's holder is another process all the same.
        second = cli(*FAST, "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "hydra.run.dir" in lines[0] and f"pid {first.pid}" in lines[0], lines[0]
        assert "Traceback" not in second.stdout + second.stderr
        assert first.poll() is None, "the refused run disturbed the first"
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()

    third = cli(*FAST, "dry_run=true", f"hydra.run.dir={run_dir}")
    assert third.returncode == 0, third.stderr
