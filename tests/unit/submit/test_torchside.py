"""The torch side of the check (hpctrain.submit.torchside), in this process: the child's answer file (what a
persistent fork server's child writes, plain JSON) and the checks without a server. The child forked from a
real server: tests/e2e/submit/test_forked_checks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import run_config_text
from hpctrain.errors import ConfigError
from hpctrain.submit import torchside

CNN = ["model=cnn", "data=digits8"]


def _answer(tmp_path: Path, overrides: list[str]) -> dict:
    config, out = tmp_path / "member.yaml", tmp_path / "answer.json"
    config.write_text(run_config_text(compose(overrides, [Path("conf").absolute()])))
    assert torchside.main([str(config), "", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_childs_answer_is_plain_data(in_project: Path, tmp_path: Path) -> None:
    assert _answer(tmp_path, CNN) == {"error": None}
    refused = _answer(tmp_path, [*CNN, "model._target_=mynets.nosuch.build"])["error"]
    assert refused["key"] == "model._target_" and refused["value"] == "mynets.nosuch.build"
    assert refused["reason"].startswith("cannot be imported") and refused["user_traceback"] is None
    raised = _answer(tmp_path, [*CNN, "model._target_=mynets.bad.raising"])["error"]
    assert raised["reason"] == "raised ValueError: width must be even"
    assert 'mynets/bad.py", line 6, in raising' in raised["user_traceback"]


def test_without_a_server_the_checks_run_here(
    in_project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HPCTRAIN_FORKSERVER", raising=False)
    composed = compose([*CNN, "model._target_=mynets.bad.needs_depth"], [Path("conf").absolute()])
    with pytest.raises(ConfigError, match="missing a required argument: 'depth'"):
        torchside.check_torch_side_where_cheapest(to_typed(composed), composed, tmp_path / "r", set())
    good = compose(CNN, [Path("conf").absolute()])
    probed: set[str] = set()
    torchside.check_torch_side_where_cheapest(to_typed(good), good, tmp_path / "r", probed)
    assert probed, "what was checked is remembered (a sweep's members share a model)"
