"""``hpctrain nodes``: the project's node record listed with its evidence, ``--forget NODE``, and every bad
input one line with exit status ≠ 0, the record untouched. In-process through the CLI's entry point."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.slurm import badnodes


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _say(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(["nodes", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_an_empty_project_has_no_record(project: Path, capsys):
    assert _say(capsys, []) == (0, f"No node is recorded in {badnodes.DEFAULT_FILE}.\n", "")
    assert not (project / ".hpctrain").exists()


def test_the_record_is_listed_newest_first_and_a_node_forgotten(project: Path, capsys):
    path = project / badnodes.DEFAULT_FILE
    now = time.time()
    badnodes.remember(path, "node3", "hang", "hung twice at step 55", "/runs/a", "7", now=now - 100 * 3600)
    badnodes.remember(
        path, "node2", "unhealthy", "health check: the scratch disk is full", "/runs/b", "9", now=now
    )
    code, out, _ = _say(capsys, [])
    lines = out.splitlines()
    assert code == 0 and re.match(r"node2\s+left out\s+unhealthy\s+0.0 h ago", lines[1]), out
    assert "/runs/b (job 9): health check: the scratch disk is full" in lines[1], out
    assert re.match(r"node3\s+expired\s+hang\s+100.0 h ago", lines[2]), out
    assert "1 node left out by the next jobs" in out
    code, out, _ = _say(capsys, ["--ttl-h", "200"])
    assert "2 nodes left out" in out
    code, out, _ = _say(capsys, ["--forget", "node2"])
    assert code == 0 and out.startswith("Forgot node2 (1 piece of evidence)"), out
    assert list(badnodes.read(path)) == ["node3"]


@pytest.mark.parametrize(
    ("argv", "words", "code"),
    [
        (["--forget", "node9"], "'node9' is not in the node record", 1),
        (["--forget", ""], "--forget takes a node's host name, not ''", 2),
        (["--forget", "node\x1b[2J"], "--forget takes a node's host name", 2),
        (["--forget", "node[1-2]"], "--forget takes a node's host name", 2),
        (["--file", ""], "--file must be a file path", 2),
        (["--file", "a\nb"], "--file must be a file path", 2),
        (["--ttl-h", "-1"], "--ttl-h must be 0 or more hours", 2),
        (["--ttl-h", "nan"], "--ttl-h must be 0 or more hours", 2),
        (["--ttl-h", "x"], "invalid float value", 2),
        (["--file", "other.json"], "is not an hpctrain node record", 1),
        (["--file", "."], "cannot be read", 1),
        (["--bogus"], "unrecognized arguments", 2),
    ],
)
def test_bad_inputs_are_one_line_and_change_nothing(
    project: Path, capsys, argv: list[str], words: str, code: int
):
    path = project / badnodes.DEFAULT_FILE
    badnodes.remember(path, "node2", "hang", "hung", "/r", "1")
    (project / "other.json").write_text('{"some": "file"}')
    before = path.read_bytes()
    got, _, err = _say(capsys, argv)
    assert got == code and len(err.strip().splitlines()) == 1 and words in err, (got, err)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("cluster.bad_node_ttl_h=-1", "cluster.bad_node_ttl_h=-1.0"),
        ("cluster.bad_node_ttl_h=x", "cluster.bad_node_ttl_h"),
        ("cluster.bad_node_file=' '", "cluster.bad_node_file= : empty (valid: a file path"),
        ("cluster.bad_node_file='a\x1bb'", "cluster.bad_node_file"),
    ],
)
def test_the_keys_bad_values_are_one_line_naming_the_key(project: Path, capsys, override: str, words: str):
    code = main(["cluster=slurm_test", override, "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert not (project / "outputs").exists()
