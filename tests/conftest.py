"""Shared helpers: run the real CLI in a subprocess, read what a run left in its directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# bench/reference_ddp.py holds the hand-written DDP loop that parity tests compare against.
sys.path.insert(0, str(REPO / "bench"))

# Small and fast: a 2-layer GPT on 200 kB of the standard library's sources.
FAST = ["data.max_bytes=200000", "trainer.eval_batches=1", "logger=jsonl"]


def hpctrain(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m hpctrain ARGS`` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def worker_pids(run_dir: Path) -> list[int]:
    """Live processes running ``hpctrain.worker RUN_DIR`` (read from /proc, no extra dependency)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hpctrain.worker" in cmdline and str(run_dir).encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
