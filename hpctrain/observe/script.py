"""Metrics from the user's own script (``task=script``) into the run's metrics.jsonl, in one line::

    from hpctrain import log_metrics
    log_metrics(step, loss=loss.item(), lr=lr)

so ``hpctrain status``, ``summary`` and ``report`` read a script's run as they read the trainer's. Rank 0
writes (the others return at once); outside an hpctrain run (no ``HPCTRAIN_RUN_DIR``) it does nothing, so
the script still runs on its own. Torch-free.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from hpctrain.rundir import RunDir
from hpctrain.rundir.files import JsonlWriter

RUN_DIR_ENV = "HPCTRAIN_RUN_DIR"  # set by hpctrain.task.script for the script's processes
_writers: dict[Path, JsonlWriter] = {}


def log_metrics(step: int, **values: float) -> None:
    """Append ``{"step": step, **values}`` to the run's metrics.jsonl (rank 0 only). ``step`` is a
    non-negative integer, each value a finite number; a ValueError names the one that is not."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"log_metrics: step={step!r} must be a non-negative integer")
    record: dict[str, float | int] = {"step": step}
    for name, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"log_metrics: {name}={value!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"log_metrics: {name}={value!r} is not finite")
        record[name] = number
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or os.environ.get("RANK", "0") != "0":
        return
    record["time"] = time.time()
    path = RunDir(Path(run_dir)).metrics
    writer = _writers.get(path)
    if writer is None:
        writer = _writers[path] = JsonlWriter(path)
    writer.write(record)
