"""The Slurm tasks of one node share one fork server (hpctrain.launch.nodeserver): the node's first task
starts it, the others join; each worker is still its own task's; no worker dies because a neighbour finished
first; a task whose shared server is gone, or whose join finds only a stale socket, starts a server of its
own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

# One "Slurm task": joins or starts the node's server, forks a child that runs CHILD, waits for it.
TASK = """
import json, os, sys, time
from hpctrain.launch.nodeserver import node_server
out, seconds = sys.argv[1], sys.argv[2]
server = node_server(os.environ, "77.r0", "nodeA")
print(json.dumps({"server": server.pid, "where": server.where}), flush=True)
with open(out, "w") as log:
    args = [out + ".child", seconds]
    child = server.spawn("nschild", args, dict(os.environ), log.fileno(), cwd=sys.argv[3])
    print(json.dumps({"returncode": child.wait()}), flush=True)
server.close()
print(json.dumps({"closed": time.time()}), flush=True)
"""
CHILD = """
import json, os, sys, time
time.sleep(float(sys.argv[2]))
info = {"ppid": os.getppid(), "local": os.environ["SLURM_LOCALID"],
        "affinity": sorted(os.sched_getaffinity(0)), "ended": time.time()}
open(sys.argv[1], "w").write(json.dumps(info))
"""


@pytest.fixture
def node_tmp() -> Iterator[Path]:
    """The node's $TMPDIR, short: a socket's path holds at most 108 bytes (pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="ns", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _task(tmp: Path, local: int, seconds: float, cpus: set[int] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "SLURM_LOCALID": str(local), "SLURM_STEP_ID": "0", "TMPDIR": str(tmp / "node")}
    env.pop("HPCTRAIN_FORKSERVER", None)
    (tmp / "node").mkdir(exist_ok=True)
    (tmp / "nschild.py").write_text(CHILD)
    out = tmp / f"task{local}"
    return subprocess.Popen(
        [sys.executable, "-c", TASK, str(out), str(seconds), str(tmp)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )


def _lines(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return {"stderr": err, **{k: v for line in out.splitlines() for k, v in json.loads(line).items()}}


def test_the_tasks_of_a_node_share_one_server_and_the_first_waits_for_the_others(node_tmp: Path):
    tmp_path = node_tmp
    cpus = sorted(os.sched_getaffinity(0))
    first = _task(tmp_path, 0, 0.1)
    second = _task(tmp_path, 1, 4.0, {cpus[-1]})  # its own CPU affinity, as Slurm binds each task
    a, b = _lines(first), _lines(second)
    assert a["server"] == b["server"] and "shared at" in a["where"], (a, b)
    assert a["returncode"] == b["returncode"] == 0
    ca = json.loads((tmp_path / "task0.child").read_text())
    cb = json.loads((tmp_path / "task1.child").read_text())
    assert ca["ppid"] == cb["ppid"] == a["server"]
    assert (ca["local"], cb["local"]) == ("0", "1") and cb["affinity"] == [cpus[-1]]
    assert a["closed"] >= cb["ended"], "the first task's agent waits until the joined task is done"
    assert not list((tmp_path / "node").rglob("*.sock")), "the server removes its socket"


def test_a_task_whose_shared_server_died_or_is_stale_starts_its_own(node_tmp: Path):
    tmp_path = node_tmp
    first = _task(tmp_path, 0, 60.0)
    second = _task(tmp_path, 1, 60.0)
    assert first.stdout is not None and second.stdout is not None
    a, b = json.loads(first.stdout.readline()), json.loads(second.stdout.readline())
    assert a["server"] == b["server"]
    time.sleep(1.0)  # both children forked
    os.kill(first.pid, signal.SIGKILL)  # the node's first task's agent dies: its server and children with it
    second.wait(timeout=60)
    assert second.returncode != 0, "the joined task's child died with the server"
    first.wait()
    stale = list((tmp_path / "node").rglob("*.sock"))
    assert len(stale) == 1, "a SIGKILLed server leaves its socket behind"
    late = _lines(_task(tmp_path, 1, 0.1))  # joins nothing: the socket answers no one
    assert late["returncode"] == 0 and "started by this launch" in late["where"], late
    assert late["server"] != a["server"]
    # It saw the socket refuse and gave up on it, rather than waiting out the join's deadline for a server
    # that would never come (which log line says which, not a clock: a loaded machine slows both).
    assert "has ended: this task starts its own" in late["stderr"], late["stderr"]
    assert "did not come" not in late["stderr"], late["stderr"]
