"""Loading a checkpoint of a real run never runs code from it, and a damaged one is never loaded silently
(hpctrain.checkpoint.safe, hpctrain.rundir.checkpoints, on runs resumed through the CLI). The pieces alone:
tests/unit/checkpoint/test_safe.py, tests/unit/rundir/test_checkpoints.py."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, hpctrain, metrics
from tests.support.exploit import Exploit

RUN = [*FAST, "trainer.max_steps=4", "trainer.ckpt_every=2", "trainer.log_every=1", "trainer.keep_last=5"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("safety") / "run"
    result = hpctrain(*RUN, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    return run


def _copy(trained: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def test_resume_skips_a_crafted_checkpoint_without_running_it(trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    newest = layout.committed(run / "checkpoints")[0]
    (newest / ".metadata").write_bytes(pickle.dumps(Exploit(marker)))
    layout.write_manifest(newest, layout.step_of(newest))  # whoever crafted it rewrote the manifest too
    result = hpctrain(*RUN, "trainer.max_steps=6", f"hydra.run.dir={run}")
    assert not marker.exists(), "the checkpoint's pickle ran"
    assert result.returncode == 0, result.stderr[-2000:]
    log = (run / "logs" / "rank0.log").read_text()
    assert "Skipping checkpoint" in log and "UnsafeCheckpoint" in log and "system" in log
    assert "Resumed from" in log and "step_00000002" in log.split("Resumed from")[1].splitlines()[0]


def test_a_flipped_bit_is_caught_by_the_checksum_and_named(trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    newest = layout.committed(run / "checkpoints")[0]
    shard = sorted(newest.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: a size-only manifest would load it
    shard.write_bytes(bytes(data))
    problem = layout.problem_with(newest)
    assert problem is not None and shard.name in problem and "checksum" in problem
    result = hpctrain(*RUN, "trainer.max_steps=6", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    log = (run / "logs" / "rank0.log").read_text()
    assert f"{shard.name} does not match its checksum" in log
    assert [r["step"] for r in metrics(run)][-2:] == [5, 6]


def test_with_every_checkpoint_damaged_the_run_trains_as_a_fresh_one(trained: Path, tmp_path: Path) -> None:
    """Every committed checkpoint has a flipped bit: each is named and skipped, none reaches the state, the
    model (built without its random init for them) is built again, and the run trains from step 0 exactly
    as a fresh one (the same losses, bitwise)."""
    run = _copy(trained, tmp_path)
    fresh = [(r["step"], r["loss"]) for r in metrics(run) if "loss" in r]
    damaged = layout.committed(run / "checkpoints")
    for checkpoint in damaged:
        shard = sorted(checkpoint.glob("*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 3] ^= 0x10
        shard.write_bytes(bytes(data))
    result = hpctrain(*RUN, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    log = (run / "logs" / "rank0.log").read_text()
    assert log.count("does not match its checksum") == len(damaged) >= 2
    assert "No loadable checkpoint" in log and "starting from scratch" in log
    # Built without its random init for the checkpoint to continue, the state is built again with it.
    assert "not a fresh one (built for a checkpoint to load): building it anew" in log
    again = [(r["step"], r["loss"]) for r in metrics(run) if "loss" in r][-len(fresh) :]
    assert again == fresh


def test_an_older_size_only_manifest_still_verifies(trained: Path, tmp_path: Path) -> None:
    import json

    run = _copy(trained, tmp_path)
    newest = layout.committed(run / "checkpoints")[0]
    manifest = json.loads((newest / layout.MANIFEST).read_text())
    old = {"step": manifest["step"], "files": {k: v["size"] for k, v in manifest["files"].items()}}
    (newest / layout.MANIFEST).write_text(json.dumps(old))
    assert layout.problem_with(newest) is None


def test_resume_after_a_torn_metrics_line(trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    with open(run / "metrics.jsonl", "a") as out:
        out.write('{"step": 5, "loss": 0.')  # the process died mid-line
    result = hpctrain(*RUN, "trainer.max_steps=6", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert all(line.endswith("}") for line in (run / "metrics.jsonl").read_text().splitlines())
