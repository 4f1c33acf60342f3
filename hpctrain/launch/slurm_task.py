"""What each Slurm task runs when submitted through submitit (imported on the node from the code snapshot)."""

from __future__ import annotations

from pathlib import Path


def run_task(run_dir: str) -> None:
    from hpctrain.worker import run

    run(Path(run_dir))
