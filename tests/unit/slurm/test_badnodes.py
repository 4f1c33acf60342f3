"""The project's node record (hpctrain.slurm.badnodes): evidence kept per node, the TTL, forgetting, and a
record that cannot be used refused in one line and never overwritten; writers of a sweep at once lose
nothing."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from hpctrain.slurm import badnodes


def test_evidence_is_kept_per_node_newest_last_and_read_back(tmp_path: Path):
    path = tmp_path / ".hpctrain" / "bad_nodes.json"  # its folder is made on the first write
    badnodes.remember(path, "node2", "unhealthy", "health check: disk full\n", "/runs/a", "12", now=100.0)
    badnodes.remember(path, "node2", "hang", "hung twice on node2", "/runs/b", "13", now=200.0)
    badnodes.remember(path, "gpu-07.cluster", "io", "[Errno 5] EIO", "/runs/b", "13", now=150.0)
    record = badnodes.read(path)
    assert [e.kind for e in record["node2"]] == ["unhealthy", "hang"]
    assert record["node2"][0] == badnodes.Evidence(
        100.0, "unhealthy", "health check: disk full", "/runs/a", "12"
    )
    data = json.loads(path.read_text())  # a file a user reads and edits
    assert data["hpctrain_bad_nodes"] == 1 and sorted(data["nodes"]) == ["gpu-07.cluster", "node2"]


def test_only_the_newest_evidence_is_kept(tmp_path: Path):
    path = tmp_path / "r.json"
    for i in range(badnodes.KEEP_PER_NODE + 5):
        badnodes.remember(path, "node1", "hang", f"time {i}", "/r", str(i), now=float(i))
    kept = badnodes.read(path)["node1"]
    assert len(kept) == badnodes.KEEP_PER_NODE and kept[-1].why == f"time {badnodes.KEEP_PER_NODE + 4}"


def test_live_nodes_are_those_with_evidence_younger_than_the_ttl_newest_first():
    hour = 3600.0
    record = {
        "old": [badnodes.Evidence(0.0, "hang", "", "/r", "1")],
        "again": [
            badnodes.Evidence(0.0, "hang", "", "/r", "1"),
            badnodes.Evidence(95 * hour, "io", "", "/r", "2"),
        ],
        "new": [badnodes.Evidence(99 * hour, "unhealthy", "", "/r", "3")],
    }
    fresh = badnodes.live(record, 24.0, 100 * hour)
    assert list(fresh) == ["new", "again"] and fresh["again"].kind == "io"
    assert badnodes.live(record, 0.0, 100 * hour) == {}


def test_forget_takes_a_node_out_and_refuses_one_not_there(tmp_path: Path):
    path = tmp_path / "r.json"
    badnodes.remember(path, "node2", "hang", "hung", "/r", "1")
    badnodes.remember(path, "node3", "hang", "hung", "/r", "1")
    assert len(badnodes.forget(path, "node2")) == 1
    assert list(badnodes.read(path)) == ["node3"]
    with pytest.raises(
        badnodes.RecordError, match=r"'node2' is not in the node record .* \(recorded: node3\)"
    ):
        badnodes.forget(path, "node2")
    with pytest.raises(badnodes.RecordError, match="recorded: none"):
        badnodes.forget(tmp_path / "missing" / "r.json", "node2")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "is not JSON"),
        ("[]", "is not an hpctrain node record"),
        ('{"hpctrain_bad_nodes": 2, "nodes": {}}', "is version 2; this hpctrain reads version 1"),
        ('{"hpctrain_bad_nodes": 1}', "has no 'nodes' object"),
        ('{"hpctrain_bad_nodes": 1, "nodes": {"a,b": []}}', "'a,b' is not a node name"),
        ('{"hpctrain_bad_nodes": 1, "nodes": {"n1": [{"time": "x"}]}}', "an entry of n1 is not time, kind"),
        ('{"hpctrain_bad_nodes": 1, "nodes": {"n1": [{"time": 1}]}}', "an entry of n1 is not time, kind"),
        ("\x00\xff", "is not JSON"),
    ],
)
def test_a_record_that_cannot_be_used_is_one_line_and_never_overwritten(tmp_path: Path, text: str, says: str):
    path = tmp_path / "r.json"
    path.write_text(text, errors="surrogateescape")
    before = path.read_bytes()
    with pytest.raises(badnodes.RecordError, match=says) as err:
        badnodes.read(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    with pytest.raises(badnodes.RecordError):
        badnodes.remember(path, "node2", "hang", "hung", "/r", "1")
    assert path.read_bytes() == before


def test_a_directory_or_a_bad_node_name_is_refused(tmp_path: Path):
    with pytest.raises(badnodes.RecordError, match="cannot be read"):
        badnodes.read(tmp_path)
    for name in ("", "node[1-3]", "a b", "x\x1b", "../etc"):
        with pytest.raises(badnodes.RecordError, match="is not a node name"):
            badnodes.remember(tmp_path / "r.json", name, "hang", "", "/r", "1")
    assert not (tmp_path / "r.json").exists()


def _write_many(path: str, node: str) -> None:
    for i in range(10):
        badnodes.remember(Path(path), node, "hang", str(i), "/r", "1")


def test_writers_at_once_lose_nothing(tmp_path: Path):
    path = tmp_path / "r.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), f"node{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    record = badnodes.read(path)
    assert sorted(record) == ["node0", "node1", "node2", "node3"]
    assert all(len(items) == 10 for items in record.values())
