"""A rank's log (hpctrain.jobs.logs.tail): the last lines, complete ones only, and where follow goes on."""

from __future__ import annotations

from pathlib import Path

from hpctrain.jobs.logs import tail


def test_tail_gives_the_last_complete_lines_and_the_offset_after_them(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(20000)) + b"half a li")
    text, offset = tail(log, 3)
    assert text == "line 19997\nline 19998\nline 19999\n"
    assert log.read_bytes()[offset:] == b"half a li"  # follow starts at the line still being written
    assert tail(log, 0) == ("", offset)
    log.write_bytes(b"")
    assert tail(log, 5) == ("", 0)
