"""The fast tier's rules in one process: which job a worker is in, where its copies live, which copies a
restart may load (this run, job, rank, world size, lineage and state layout; whole), the room it needs."""

from __future__ import annotations

import logging
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint.direct import DirectWriter
from hpctrain.checkpoint.fast import FastTier
from hpctrain.checkpoint.reader import FastReader
from hpctrain.checkpoint.safe import SafeLoadPlanner
from hpctrain.checkpoint.staging import state_signature
from hpctrain.errors import ConfigError
from hpctrain.rundir import checkpoints as layout

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


@pytest.mark.parametrize(
    ("environ", "job"),
    [
        ({"SLURM_PROCID": "1", "SLURM_JOB_ID": "4242"}, "slurm-4242-r0"),
        ({"SLURM_PROCID": "0", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"}, "slurm-4242-r2"),
        ({"HPCTRAIN_JOB_ID": "abc-1.2_x"}, "local-abc-1.2_x"),
        # A local launch inside an salloc shell: the launcher's id, not the allocation's.
        ({"SLURM_JOB_ID": "4242", "HPCTRAIN_JOB_ID": "abc"}, "local-abc"),
        ({"HPCTRAIN_JOB_ID": "../etc"}, None),
        ({"HPCTRAIN_JOB_ID": ""}, None),
        ({}, None),
    ],
)
def test_the_job_a_worker_is_in(environ: dict[str, str], job: str | None) -> None:
    assert layout.job_identity(environ) == job


def _tier(
    tmp_path: Path, job: str = "local-j1", rank: int = 0, world: int = 1, per_node: int = 1
) -> FastTier:
    paths = layout.FastTierPaths(tmp_path / "shm", layout.run_key(tmp_path / "run"), job)
    return FastTier(paths, "node1", rank, world, per_node)


def test_paths_are_keyed_by_run_job_host_and_rank(tmp_path: Path) -> None:
    tier = _tier(tmp_path, rank=3, world=4, per_node=2)
    assert tier.own == tier.paths.job_root / "node1" / "rank3" / "own"
    assert tier.peer_of(3) == 1 and tier.source_of(3) == 1 and tier.peer_of(0) == 2
    assert tier.held(1) == tier.paths.job_root / "node1" / "rank3" / "peer-rank1"
    assert _tier(tmp_path, world=2, per_node=2).peer_of(0) is None, "one node: no peer"

    other = _tier(tmp_path, job="local-j0")
    other.paths.make(other.own)
    tier.prepare(1000, "checkpoint.local_path")  # removes the run's earlier job, makes this one's paths
    assert not other.paths.job_root.exists() and tier.own.is_dir()
    tier.paths.remove_job()
    assert not tier.paths.run_root.exists() and not tier.paths.user_root.exists()


def _state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {"model": {"w": torch.randn(64, 8), "b": torch.randn(8)}, "step": torch.tensor(float(seed))}


def _copy(directory: Path, step: int, state: dict[str, Any], **info: Any) -> Path:
    tmp = directory / f".tmp-step_{step:08d}"
    dcp.save(state, storage_writer=DirectWriter(tmp, direct=False), no_dist=True)
    layout.write_manifest(tmp, step, **info)
    final = directory / layout.checkpoint_name(step)
    tmp.rename(final)
    return final


def test_only_copies_of_this_run_job_rank_lineage_and_layout_are_candidates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = _tier(tmp_path, world=2)
    tier.prepare(1000, "checkpoint.local_path")
    tier.paths.make(tier.held(1))
    state = _state(0)
    signature = state_signature(state)
    good = {
        "lineage": "L1",
        "run": tier.paths.run,
        "job": tier.paths.job,
        "rank": 0,
        "world_size": 2,
        "signature": signature,
        "tier": "local",
    }
    _copy(tier.own, 4, state, **good)
    _copy(tier.own, 6, state, **{**good, "lineage": "L0"})  # another run history's (planted, or older)
    _copy(tier.own, 8, state, **{**good, "signature": "0" * 16})  # another layout
    _copy(tier.own, 10, state, **{**good, "world_size": 4})
    _copy(tier.held(1), 4, state, **{**good, "rank": 1})
    _copy(tier.held(1), 12, state, **{**good, "rank": 1, "run": "elsewhere"})
    truncated = _copy(tier.held(1), 14, state, **{**good, "rank": 1})
    shard = next(truncated.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])
    with caplog.at_level(logging.WARNING, logger="hpctrain.checkpoint.fast"):
        found = tier.candidates("L1", signature)
    assert sorted(found.own) == [4] and {o: sorted(s) for o, s in found.held.items()} == {1: [4]}
    for says in (
        "its lineage is 'L0', this run's 'L1'",
        "its signature is '0000000000000000'",
        "its world_size is 4, this run's 2",
        "its run is 'elsewhere'",
        "bytes, the manifest says",
    ):
        assert says in caplog.text
    assert tier.candidates(None, signature).own == {}, "no lineage record: nothing of the tier is loaded"


def test_a_restart_loads_the_newest_whole_copy_newer_than_the_shared_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = _tier(tmp_path)
    tier.prepare(1000, "checkpoint.local_path")
    info = {
        "lineage": "L1",
        "run": tier.paths.run,
        "job": tier.paths.job,
        "rank": 0,
        "world_size": 1,
        "signature": state_signature(_state(0)),
        "tier": "local",
    }
    for step in (4, 6):  # a writer keeps the newest only; two here, so that one can fall back to the other
        (tier.own / f"keep{step}").mkdir()
        _copy(tier.own / f"keep{step}", step, _state(step), **info).rename(
            tier.own / layout.checkpoint_name(step)
        )
    shard = next((tier.own / "step_00000006").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x20
    shard.write_bytes(bytes(data))
    state = _state(0)

    def load(copy: Path) -> str | None:
        try:
            dcp.load(state, storage_reader=FastReader(copy), planner=SafeLoadPlanner(), no_dist=True)
        except BaseException as err:
            return str(next(iter(err.failures.values()))[0]) if hasattr(err, "failures") else str(err)
        return None

    found = tier.candidates("L1", info["signature"])
    assert tier.restore(found, 6, None, load) is None, "nothing newer than the shared step 6"
    with caplog.at_level(logging.WARNING):
        got = tier.restore(found, 3, None, load)
    assert got is not None and got[0] == 4 and got[2] == "its own copy"
    assert "step 6, not loaded: __0_0.distcp does not match its checksum" in caplog.text
    assert torch.equal(state["model"]["w"], _state(4)["model"]["w"]) and float(state["step"]) == 4.0


def test_a_path_that_is_not_writable_is_refused_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    paths = layout.FastTierPaths(blocker, "run", "local-j")
    with pytest.raises(ConfigError) as caught:
        FastTier(paths, "node1", 0, 1, 1).prepare(1000, "checkpoint.local_path")
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"checkpoint.local_path={blocker}: not writable")


def test_a_path_too_small_for_the_state_is_refused_naming_the_sizes(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        paths = layout.FastTierPaths(small, "run", "local-j")
        tier = FastTier(paths, "node1", 0, 4, 2)
        with pytest.raises(ConfigError) as caught:
            tier.prepare(100 << 20, "checkpoint.local_path")
        line = str(caught.value)
        assert "\n" not in line and line.startswith(f"checkpoint.local_path={small}: 0.00 GiB free on node1")
        assert "needs 0.98 GiB (2 rank(s) × 5 × 0.10 GiB of state" in line
        FastTier(paths, "node1", 0, 1, 1).prepare(100 << 10, "checkpoint.local_path")  # this fits
    finally:
        subprocess.run(["umount", str(small)], check=True)
