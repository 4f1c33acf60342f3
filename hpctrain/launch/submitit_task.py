"""What each Slurm task runs when submitted through submitit (imported on the node from the code snapshot).

The worker is named, not imported: like the local launcher (``python -m hpctrain.worker``) and the sbatch
templates, the launch layer starts the worker side by module name and never imports it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

WORKER_MODULE = "hpctrain.worker"


def run_task(run_dir: str) -> None:
    importlib.import_module(WORKER_MODULE).run(Path(run_dir))
