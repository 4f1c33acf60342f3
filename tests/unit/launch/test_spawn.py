"""hpctrain.launch.spawn, the one place that starts the worker: without a fork server, a fresh interpreter
runs ``python -m hpctrain.worker RUN_DIR`` (here one no launcher set up, which fails and records why).
(Forked starts: the e2e launch tests; the rule that no other module starts the worker:
tests/unit/test_architecture.py.)"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.launch.spawn import start_worker
from hpctrain.rundir.records import read_error_record


def test_without_a_server_the_worker_is_a_fresh_interpreter(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
    env["HPCTRAIN_SPAWN_TEST"] = "1"
    with open(tmp_path / "out.log", "wb") as out:
        worker = start_worker(tmp_path / "run", env, out=out.fileno())
    assert worker.wait(timeout=60) == 1  # no launcher set it up: it says so and fails, recorded
    record = read_error_record(tmp_path / "run", 0)
    assert record is not None and "not started by a launcher" in record["message"], record
    assert getattr(worker, "args", None)[1:3] == ["-m", "hpctrain.worker"]  # type: ignore[index]
