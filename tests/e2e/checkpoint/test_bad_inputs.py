"""A fast tier without room for the state is refused before training starts, in one line naming the sizes
(checked by every worker, where the node-local path is: on a Slurm node, the submitting machine cannot)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import FAST, hpctrain


def test_a_fast_tier_too_small_for_the_state_is_refused_naming_the_sizes(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        run = tmp_path / "run"
        result = hpctrain(
            *FAST,
            "cluster.nproc=2",
            "trainer.max_steps=4",
            "checkpoint.local_every=2",
            f"checkpoint.local_path={small}",
            f"hydra.run.dir={run}",
        )
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert (
        f"checkpoint.local_path={small}: 0.00 GiB free on" in lines[0] and "the fast tier needs" in lines[0]
    )
    assert "GiB of state" in lines[0] and "alike" in lines[0]
    assert not (run / "metrics.jsonl").exists(), "training started"
