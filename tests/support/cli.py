"""What a refusal of the CLI must look like, for the fast tests of its commands."""

from __future__ import annotations

import pytest

from hpctrain.cli import main


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], words: str, code: int = 2) -> str:
    """``hpctrain ARGV`` refused: exit ``code``, one line naming ``words``, no traceback. The line."""
    got = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert got == code, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("hpctrain"), err
    assert words in lines[0], err
    return lines[0]
