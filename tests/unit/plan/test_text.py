"""``hpctrain plan`` (hpctrain.plan.text, hpctrain.cli.plan): the table of memory, time, cost and
alternatives; the exit status says whether it fits; the submit path imports no torch (a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import CLI, REPO
from tests.support.configs import SEVEN_B


def test_plan_command_prints_the_table_and_the_submit_path_stays_torch_free(cli: CLI, tmp_path: Path):
    result = cli("plan", *SEVEN_B, "parallel=ddp")
    assert result.returncode == 1, result.stderr  # does not fit
    for words in (
        "memory per GPU",
        "optimizer state",
        "DOES NOT FIT",
        "DDP all-reduce",
        "GPU-hours",
        "alternatives",
    ):
        assert words in result.stdout, words
    fits = cli("plan", *SEVEN_B, "parallel=3d", "model.tie_embeddings=false")
    assert fits.returncode == 0 and "FITS" in fits.stdout, fits.stderr
    code = (
        "import sys; from hpctrain.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported on the submit path'; sys.exit(rc)"
    )
    checked = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            *SEVEN_B,
            "parallel=3d",
            "model.tie_embeddings=false",
            "dry_run=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ},
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
