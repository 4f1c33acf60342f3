"""The run directory's files: one atomic write, readers that survive a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from hpctrain.rundir.files import JsonlWriter, atomic_write, read_jsonl


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    atomic_write(path, "a: 1\n")

    def broken(out):  # type: ignore[no-untyped-def]
        out.write(b"a: 2\n")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_text() == "a: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temporary file left behind


def test_a_torn_last_metrics_line_is_skipped_and_dropped_on_resume(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    rd.metrics.write_text("\n".join(lines) + "\n" + '{"step": 4, "lo')  # a crash mid-write
    assert [r["step"] for r in rd.read_metrics()] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(rd.metrics, tail_bytes=60)] == [3]  # a cut first line too
    writer = JsonlWriter(rd.metrics)
    writer.keep_only(lambda r: r["step"] <= 2)  # what a resume from step 2 does
    writer.write({"step": 3, "loss": 0.5})
    writer.close()
    assert [json.loads(line)["step"] for line in rd.metrics.read_text().splitlines()] == [1, 2, 3]
