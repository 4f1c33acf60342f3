"""logger=wandb offline: one W&B run id for a run, kept in the checkpoint, so a resumed run continues it."""

from __future__ import annotations

import re
from pathlib import Path

from hpctrain.checkpoint.manager import read_checkpoint
from tests.support import FAST, hpctrain


def test_wandb_offline_run_id_survives_resume(run_dir: Path):
    args = [
        *FAST,
        "logger=wandb",
        "logger.progress_bar=false",
        "cluster.nproc=1",
        "parallel=none",
        f"hydra.run.dir={run_dir}",
    ]
    assert hpctrain(*args, "trainer.max_steps=4").returncode == 0
    first_id = read_checkpoint(run_dir / "checkpoints" / "step_00000004")["train"]["wandb_run_id"]
    assert re.fullmatch(r"[a-z0-9]{8}", first_id)
    assert hpctrain(*args, "trainer.max_steps=8").returncode == 0
    assert read_checkpoint(run_dir / "checkpoints" / "step_00000008")["train"]["wandb_run_id"] == first_id
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{first_id}") for name in runs), runs
