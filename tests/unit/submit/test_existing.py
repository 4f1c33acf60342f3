"""A run's name and the directory it names (hpctrain.submit.existing.named_run_overrides)."""

from __future__ import annotations

import pytest

from hpctrain.errors import ConfigError
from hpctrain.submit.existing import named_run_overrides


def test_a_name_is_its_stable_directory() -> None:
    assert named_run_overrides(None, [], False) == []
    assert named_run_overrides("gpt-small", [], False) == ["hydra.run.dir=outputs/gpt-small"]
    assert named_run_overrides("gpt-small", [], True) == ["hydra.sweep.dir=multirun/gpt-small"]
    assert named_run_overrides("a", ["hydra.run.dir=outputs/a"], False) == []  # given already


@pytest.mark.parametrize("name", ["", "..", "a/b", "x\ny", "-a"])
def test_what_is_not_a_name_is_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        named_run_overrides(name, [], False)
    assert str(refused.value).startswith("run=") and "\n" not in str(refused.value).replace(name, "")


def test_a_name_and_a_directory_both_given_is_refused() -> None:
    with pytest.raises(ConfigError, match="both name the run's directory"):
        named_run_overrides("a", ["hydra.run.dir=/tmp/elsewhere"], False)
