"""trainer.ckpt_every=auto on several ranks: every input of the interval is agreed, so every rank saves at the
same steps. Each rank reads the observed MTBF at its own time and view of the run's files; an interval one
step apart sent one rank into a save's collectives while another trained on (a hang after the first
interruption, bench/chaos.py, 2026-12-07)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.checkpoint.cadence import AutoInterval
from hpctrain.verify.local_group import start_ranks

WORLD = 2


def worker(rank: int, run_dir: str, store: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        import time

        real = time.time
        # Rank 1 looks 40 s later: one interruption in a 100 s run on rank 0, in 140 s on rank 1.
        time.time = lambda: real() + 40.0 * rank  # type: ignore[assignment]
        auto = AutoInterval(Path(run_dir), 3600.0, torch.device("cpu"), background=True)
        everies = []
        for step, (step_s, save_s) in enumerate([(0.05 + 0.01 * rank, 0.2), (0.05, 0.3 + rank), (0.05, 0.1)]):
            auto.step_done(step_s * (1 + rank), writing=True)
            auto.step_done(step_s, writing=False)
            auto.saved(step + 1, step_s, save_s)
            everies.append(auto.every)
        Path(out, f"rank{rank}.json").write_text(json.dumps(everies))
    finally:
        dist.destroy_process_group()


def test_every_rank_agrees_on_the_interval(tmp_path: Path) -> None:
    import time

    run = tmp_path / "run"
    run.mkdir()
    now = time.time()
    # A run 100 s old with one restart: the MTBF is observed (not cluster.mtbf_h), read at each rank's now.
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": now - 100.0}) + "\n")
    (run / "restarts.jsonl").write_text(json.dumps({"time": now - 50.0, "action": "restart"}) + "\n")
    start_ranks(worker, WORLD, str(run), str(tmp_path / "store"), str(tmp_path))
    ours, theirs = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert ours == theirs, (ours, theirs)
    assert len(set(ours)) > 1  # each save refined it (the costs changed)
