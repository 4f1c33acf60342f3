"""A ``cluster.env`` value whose name looks secret is never recorded in the run directory, yet reaches the
local workers (hpctrain.config.redact, hpctrain.launch.local). The Slurm side:
tests/unit/config/test_redact.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import FAST, REPO, worker_pids


def _grep(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_secret_env_value_is_not_recorded_but_reaches_the_workers(tmp_path: Path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            *FAST,
            "trainer.max_steps=100000",
            "++cluster.env.MY_API_KEY=s3cretvalue",
            "++cluster.env.PLAIN=visible",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        environ = b""
        while b"MY_API_KEY=" not in environ:
            assert first.poll() is None and time.monotonic() < deadline, "no worker started"
            for pid in worker_pids(run_dir):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
            time.sleep(0.1)
        assert b"\0MY_API_KEY=s3cretvalue\0" in environ and b"\0PLAIN=visible\0" in environ
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert (run_dir / "config.yaml").is_file() and "visible" in (run_dir / "config.yaml").read_text()
    assert "***" in (run_dir / "config.yaml").read_text()
    assert _grep(run_dir, "s3cretvalue") == []
