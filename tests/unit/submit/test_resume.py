"""The command that continues a run (hpctrain.submit.resume.resume_command): refusals in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.submit.resume import resume_command


def test_what_is_not_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        resume_command(tmp_path / "missing", [])
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="is not a run hpctrain started"):
        resume_command(tmp_path / "folder", [])
