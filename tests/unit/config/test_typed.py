"""A composed config → the typed Config (hpctrain.config.typed): a target group's own keys typed and its
arguments handed on; a wrong type is one line naming the key; an import path that names nothing says which
part is missing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hpctrain.config.compose import compose
from hpctrain.config.typed import locate, to_config, typed_from
from hpctrain.errors import ConfigError


@dataclass
class Shape:
    width: int = 1
    scale: float = 1.0
    name: str | None = None


def test_target_groups_split_into_own_keys_and_arguments() -> None:
    composed = compose(["model=vit", "data=digits", "model.image_size=8"])
    cfg = to_config({k: composed[k] for k in composed if k != "hydra"})
    assert cfg.model.target == "hpctrain.models.vit.ViT" and cfg.model.args["image_size"] == 8
    assert cfg.data.name == "digits" and cfg.loss.target == "hpctrain.train.loss.cross_entropy"
    assert "_target_" not in cfg.model.args


def test_values_are_typed_or_refused_naming_the_key() -> None:
    assert typed_from(Shape, {"width": 3, "scale": 2}, "model") == Shape(3, 2.0)  # an int for a float
    assert typed_from(Shape, {"width": "4"}, "model") == Shape(4)  # OmegaConf converts what it can
    with pytest.raises(
        ConfigError, match=r"^model\.width=wide: expected int$"
    ):  # as hpctrain's schema spells it
        typed_from(Shape, {"width": "wide"}, "model")


def test_locate_finds_objects_and_says_what_is_missing() -> None:
    assert locate("model._target_", "hpctrain.models.gpt.GPT").__name__ == "GPT"
    with pytest.raises(
        ConfigError, match=r"cannot be imported: hpctrain\.models\.gpt has no attribute 'Nope'"
    ):
        locate("model._target_", "hpctrain.models.gpt.Nope")
    with pytest.raises(ConfigError, match=r"cannot be imported: no module named 'nosuchpkg'"):
        locate("data._target_", "nosuchpkg.data.build")
