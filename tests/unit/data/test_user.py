"""A user's own dataset (hpctrain.data.user): built from its target, batched with the user's collate, and each
wrong input one line; the user's own exception is raised as itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from hpctrain.data.user import ItemDataset, build_user_datasets
from hpctrain.errors import ConfigError


def test_custom_collate_node_with_an_argument(on_path: None) -> None:
    node = {"_target_": "h2_user_data.stack_scaled", "scale": 10.0}
    train, _ = build_user_datasets("h2_user_data.Pairs", {"n": 9, "dim": 2}, node)
    x, y = train.get_batch(np.array([1, 2]))
    assert torch.equal(x, torch.tensor([[0.0, 10.0], [0.0, 20.0]])) and torch.equal(y, torch.tensor([1, 2]))


@pytest.mark.parametrize(
    ("target", "args", "expect"),
    [
        ("h2_no_such_module.Data", {}, "cannot be imported"),
        ("h2_user_data.Missing", {}, "has no attribute 'Missing'"),
        ("h2_user_data.Pairs", {"n": 3, "dim": {"_target_": "h2_user_data.Nope"}}, "data.dim._target_="),
        ("h2_user_data.nothing", {}, "has no items"),
        ("h2_user_data.number", {}, "returned int, not a map-style dataset"),
        ("h2_user_data.Stream", {}, "returned Stream, not a map-style dataset"),
        ("h2_user_data.Pairs", {"n": 0, "dim": 1}, "the train split has no items"),
    ],
)
def test_wrong_datasets_are_one_line(on_path: None, target: str, args: dict[str, Any], expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_user_datasets(target, args, None)
    assert expect in str(err.value) and "\n" not in str(err.value)


def test_users_exception_propagates_as_itself(on_path: None) -> None:
    with pytest.raises(KeyError, match="the user's own message") as err:
        build_user_datasets("h2_user_data.broken", {}, None)
    assert err.value.__context__ is None  # not chained to hydra's wrapper
    assert err.traceback[-1].name == "broken"  # their frame is where it points


def test_item_of_the_wrong_type_is_one_line(on_path: None) -> None:
    train, _ = build_user_datasets("h2_user_data.Strings", {"n": 4, "dim": 1}, None)
    with pytest.raises(ValueError, match=r"item 2 is a str.*\(input, target\) pair or a dict") as err:
        train.get_batch([2])
    assert "\n" not in str(err.value)
    assert isinstance(train, ItemDataset)
