"""What a folder from elsewhere may build (hpctrain.weights.trust.check_trusted): model classes only."""

from __future__ import annotations

import pytest

from hpctrain.errors import ConfigError
from hpctrain.weights.trust import check_trusted


def test_a_model_class_is_trusted_and_any_other_callable_is_not() -> None:
    check_trusted("hpctrain.models.gpt.GPT", {}, "config.yaml")
    with pytest.raises(ConfigError, match="not a model class"):
        check_trusted("builtins.open", {}, "config.yaml")
    with pytest.raises(ConfigError, match="not a model class"):
        check_trusted("hpctrain.models.gpt.GPT", {"inner": {"_target_": "os.system"}}, "hpctrain.json")
