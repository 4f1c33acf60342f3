"""``hpctrain save|stop RUN_DIR``: ask a live run (local or Slurm) for a checkpoint now, or for a checkpoint
and its end without a requeue. Torch-free.

The request is RUN_DIR/control.json, written atomically by whoever can write to the run directory; the run's
rank 0 sees it at its next step boundary (:class:`hpctrain.resilience.stop.StopCheck`), every rank saves
that step, and rank 0 writes the answer (the step saved) into the same file. Refused in one line: a missing
directory, a directory that is not a run, one this user cannot write to, a run that is not running (its
lock is free: finished, failed, or not started), and a request while another is unanswered.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from pathlib import Path

from hpctrain.jobs.targets import JobsError
from hpctrain.rundir import RunDir, RunLock

REQUESTS = ("save", "stop")
# An unanswered request older than this is taken for one its run never saw (it ended first): replaced.
STALE_REQUEST_S = 3600.0


def live_run(run_dir: Path, what: str) -> RunDir:
    """The run directory of a running run this user may ask to ``what``; JobsError: one line why not."""
    rd = RunDir(run_dir)
    if not rd.path.is_dir():
        raise JobsError(f"{run_dir}: no such run directory")
    if not rd.is_run():
        raise JobsError(f"{run_dir}: not a run directory (no config.yaml, metrics.jsonl or job.json)")
    if not os.access(rd.path, os.W_OK):
        raise JobsError(f"{run_dir}: this user cannot write to the run directory, so cannot ask it to {what}")
    if not RunLock(rd.path).is_held():
        raise JobsError(
            f"{run_dir}: the run is not running (finished, failed or not started): nothing to {what}"
        )
    return rd


def request(run_dir: Path, what: str, wait_s: float) -> str:
    """Write the request and wait up to ``wait_s`` for its answer; the line to print. JobsError: refused."""
    assert what in REQUESTS
    rd = live_run(run_dir, what)
    pending = rd.read_control()
    age = time.time() - float(pending.get("time", 0)) if pending else 0.0
    if pending and "answered" not in pending and age < STALE_REQUEST_S:
        raise JobsError(
            f"{run_dir}: a {pending.get('request')} request from {pending.get('user')} is in flight "
            f"(made {age:.0f} s ago): wait for its answer"
        )
    ident = uuid.uuid4().hex[:12]
    record = {
        "request": what,
        "id": ident,
        "time": time.time(),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
    }
    rd.write_control(record)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        answer = rd.read_control()
        if answer and answer.get("id") == ident and "answered" in answer:
            if what == "save":
                return f"saved a checkpoint of step {answer['step']}; the run trains on"
            return f"saved a checkpoint of step {answer['step']} and stopped (no requeue)"
        if not RunLock(rd.path).is_held():
            raise JobsError(f"{run_dir}: the run ended before it answered the {what} request")
        time.sleep(0.2)
    return f"asked the run to {what}; no answer within {wait_s:.0f} s (it answers at its next step boundary)"


def describe(record: dict[str, object] | None) -> str | None:
    """``hpctrain status``'s line for the last request, or None."""
    if not record or record.get("request") not in REQUESTS:
        return None
    who = f"{record.get('user')}@{record.get('host')}"
    if "answered" not in record:
        return f"{record['request']} requested by {who}, not yet answered"
    if record["request"] == "stop":
        return f"stopped by the user ({who}) after saving step {record.get('step')}"
    return f"saved step {record.get('step')} on request of {who}"
