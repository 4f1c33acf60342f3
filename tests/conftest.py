"""Shared helpers: run the real CLI in a subprocess, read what a run left in its directory; one fork server
for the whole session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
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


@pytest.fixture(autouse=True)
def _fork_server_beyond_the_fast_tier(request: pytest.FixtureRequest) -> None:
    """Every test outside tests/unit/ (which starts no process) has the session's fork server."""
    if "unit" not in request.node.path.relative_to(REPO).parts:
        request.getfixturevalue("fork_server")


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """One fork server for the session (``HPCTRAIN_FORKSERVER``): every local launch of the suite forks its
    ranks from a process that imported torch once. ``HPCTRAIN_TEST_FORKSERVER=per-launch`` leaves each
    launch its own server, ``=off`` starts every rank as a fresh interpreter; a ``HPCTRAIN_FORKSERVER``
    already set is used as it is."""
    from hpctrain.errors import ConfigError
    from hpctrain.launch.forked import FORKSERVER_ENV, OFF, SERVER_MODULE, ForkServer

    mode = os.environ.get("HPCTRAIN_TEST_FORKSERVER", "persistent")
    if FORKSERVER_ENV in os.environ or mode == "per-launch":
        yield os.environ.get(FORKSERVER_ENV)
        return
    if mode == "off":
        os.environ[FORKSERVER_ENV] = OFF
        yield OFF
        del os.environ[FORKSERVER_ENV]
        return
    path = str(tmp_path_factory.mktemp("forkserver") / "s.sock")
    command = [sys.executable, "-m", SERVER_MODULE, "--socket", path, "--parent", str(os.getpid())]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        while True:  # listening; it answers once its imports are done, while the first tests run
            assert server.poll() is None, f"the fork server ended with {server.returncode}"
            try:
                ForkServer.connect(path).close()
                break
            except ConfigError:
                time.sleep(0.05)
        os.environ[FORKSERVER_ENV] = path
        yield path
    finally:
        os.environ.pop(FORKSERVER_ENV, None)
        server.terminate()
        server.wait(timeout=30)
