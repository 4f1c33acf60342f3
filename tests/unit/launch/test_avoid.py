"""Which recorded nodes a job leaves out (hpctrain.launch.avoid): never a partition whole, never fewer nodes
than the job needs, only the partition's own names; the record is a help, so a job goes on without it
when it cannot be used, and says so. The test cluster proves the whole path (tests/slurm/test_recovery.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hpctrain.config.schema import ClusterConfig
from hpctrain.launch import avoid
from hpctrain.launch.jobscript import node_record, setup_lines
from hpctrain.slurm import badnodes

POOL = {f"n{i}" for i in range(1, 9)}  # an 8-node partition


@pytest.mark.parametrize(
    ("fresh", "pool", "typed", "needed", "chosen"),
    [
        (["n1"], POOL, set(), 2, ["n1"]),
        (["n1", "n2", "n3", "n4", "n5"], POOL, set(), 2, ["n1", "n2", "n3", "n4"]),  # at most half
        (["n1", "n2", "n3"], POOL, set(), 6, ["n1", "n2"]),  # the job's 6 nodes stay
        (["n1", "n2"], POOL, {"n7", "n8"}, 6, []),  # the typed exclusion counts too
        (["other", "n3"], POOL, set(), 1, ["n3"]),  # a name of another partition: sbatch would refuse it
        (["n1"], {"n1"}, set(), 1, []),  # a one-node partition is never excluded
        (["n1"], None, set(), 1, []),  # the partition's nodes unknown: nothing
    ],
)
def test_choose(fresh: list[str], pool: set[str] | None, typed: set[str], needed: int, chosen: list[str]):
    left_out, kept = avoid.choose(fresh, pool, typed, needed)
    assert left_out == chosen
    assert set(left_out).isdisjoint(kept) and set(left_out) | set(kept) <= set(fresh)


def _slurm(**changes: object) -> ClusterConfig:
    return dataclasses.replace(ClusterConfig(), kind="slurm", partition="debug", **changes)


def test_the_record_is_relative_to_the_submit_directory_and_off_with_null_or_a_ttl_of_0(tmp_path: Path):
    assert node_record(_slurm(), tmp_path) == tmp_path / badnodes.DEFAULT_FILE
    assert node_record(_slurm(bad_node_file="/shared/team.json"), tmp_path) == Path("/shared/team.json")
    assert node_record(_slurm(bad_node_file=None), tmp_path) is None
    assert node_record(_slurm(bad_node_ttl_h=0.0), tmp_path) is None
    lines = setup_lines(_slurm(), tmp_path / "code", None, tmp_path)
    assert f"export {badnodes.RECORD_ENV}={tmp_path / badnodes.DEFAULT_FILE}" in lines
    assert not any(badnodes.RECORD_ENV in line for line in setup_lines(_slurm(bad_node_file=None), tmp_path))


def test_a_record_that_cannot_be_used_leaves_the_typed_exclusion_and_says_why(tmp_path: Path, capsys):
    record = tmp_path / "garbled.json"
    record.write_text("{")
    cluster = _slurm(bad_node_file=str(record), exclude="n8")
    assert avoid.job_exclude(cluster) == "n8"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not JSON" in err and "no recorded node is left out" in err, err
    assert record.read_text() == "{"


def test_without_the_partitions_nodes_no_recorded_node_is_left_out(tmp_path: Path, capsys, monkeypatch):
    record = tmp_path / "r.json"
    badnodes.remember(record, "n2", "hang", "hung twice", "/r", "1")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))  # no client can answer here
    avoid._pool.cache_clear()  # asked once per command: this test's own
    assert avoid.job_exclude(_slurm(bad_node_file=str(record))) is None
    assert "not leaving out recorded n2: sinfo cannot list the partition's nodes" in capsys.readouterr().err
    # Over ssh the record is the cluster's side's: the typed exclusion only.
    assert avoid.job_exclude(_slurm(bad_node_file=str(record), ssh="login", exclude="n1")) == "n1"
