"""One run per run directory (hpctrain.rundir.lock) in this process: a second holder is refused in one line
naming the first; the lock is free again once released. (Held by a live run, across processes:
tests/e2e/rundir/test_lock.py.)"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.rundir.lock import LOCK_FILE, RunLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunLock(run).acquire(job_id="4242") as first:
        assert first.is_held()
        record = json.loads((run / LOCK_FILE).read_text())
        assert record == {"host": socket.gethostname(), "pid": os.getpid(), "job_id": "4242"}
        with pytest.raises(ConfigError) as refused:
            RunLock(run).acquire(wait_s=0.3)  # another open file description: flock refuses it
        message = str(refused.value)
        assert message.startswith(f"hydra.run.dir={run}: another run is using this directory")
        assert f"held by pid {os.getpid()} on {socket.gethostname()}, Slurm job 4242" in message
        assert "\n" not in message
    assert not RunLock(run).is_held()
    with RunLock(run).acquire() as again:  # free once released; the record is the new holder's
        assert json.loads((run / LOCK_FILE).read_text())["job_id"] is None
        assert again.is_held()


def test_a_holder_that_has_not_recorded_itself_is_named_so(tmp_path: Path) -> None:
    with RunLock(tmp_path).acquire():
        (tmp_path / LOCK_FILE).write_text("")  # taken, record not yet written
        with pytest.raises(ConfigError, match="held by a process that has not yet recorded itself"):
            RunLock(tmp_path).acquire()


def test_no_lock_file_is_no_holder(tmp_path: Path) -> None:
    assert not RunLock(tmp_path / "absent").is_held()
