"""The user's own dataset: a ``_target_`` called with ``split`` plus its arguments, as a batch source.

The callable returns a map-style dataset (``__len__``, ``__getitem__``); an item is an ``(input, target)``
pair or a dict of tensors (``input_ids``/``labels``, ``pixel_values``/``labels``, or keys of the user's).
:class:`ItemDataset` gives it the interface of the built-in datasets, ``get_batch(indices)``: the items
collated by torch's ``default_collate``, or by the user's ``data.collate._target_``. Sample i must be a pure
function of the dataset's arguments and i (no random augmentation drawn from a global stream), which is
what makes a resumed run, or one resharded over another world size, see exactly the same samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpctrain.config.typed import locate
from hpctrain.errors import ConfigError

SPLITS = ("train", "val")


class ItemDataset:
    """A user's map-style dataset with ``get_batch``."""

    def __init__(self, items: Any, collate: Callable[[list[Any]], Any], name: str) -> None:
        self.items, self.collate, self.name = items, collate, name

    def __len__(self) -> int:
        return len(self.items)

    def get_batch(self, indices: Sequence[int]) -> Any:
        batch = []
        for i in indices:
            item = self.items[int(i)]
            if not (isinstance(item, dict) or (isinstance(item, (tuple, list)) and len(item) == 2)):
                raise ConfigError(
                    "data._target_",
                    self.name,
                    f"item {int(i)} is a {type(item).__name__}"
                    + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""),
                    valid="an (input, target) pair or a dict of tensors",
                )
            batch.append(item)
        try:
            out = self.collate(batch)
        except Exception as err:
            from hpctrain.errors import first_line, user_traceback

            if user_traceback(err) is not None:  # the user's own collate raised: theirs, with its frames
                raise
            shown = ", ".join(str(int(i)) for i in indices[:4]) + (", ..." if len(indices) > 4 else "")
            raise ConfigError(
                "data._target_",
                self.name,
                f"items {shown} cannot be collated into a batch: {first_line(err)}",
                valid="items of one shape, or a data.collate._target_ that pads them",
            ) from None
        # default_collate turns tuples of items into a list; the trainer unpacks (input, target) as the
        # built-in datasets give it, so a pair leaves as a tuple whichever collate built it.
        return tuple(out) if isinstance(out, list) and len(out) == 2 else out


def build_user_datasets(
    target: str, args: dict[str, Any], collate: dict[str, Any] | None
) -> tuple[ItemDataset, ItemDataset]:
    """``(train, val)``: ``target(split="train", **args)`` and ``split="val"`` (nested ``_target_``s in
    ``args`` instantiated first), each checked to be a non-empty map-style dataset."""
    from hydra.utils import instantiate
    from torch.utils.data import IterableDataset, default_collate

    locate("data._target_", target)
    _locate_nested("data", args)  # a nested target that cannot be imported is a config error, not the user's
    collate_fn: Callable[[list[Any]], Any] = default_collate
    if collate is not None:
        locate("data.collate._target_", str(collate.get("_target_")))
        collate_fn = instantiate(collate, _partial_=True)
    out = []
    for split in SPLITS:
        items = _call_user(instantiate, {"_target_": target, **args, "split": split})
        if isinstance(items, IterableDataset) or not (
            hasattr(items, "__len__") and hasattr(items, "__getitem__")
        ):
            raise ConfigError(
                "data._target_",
                target,
                f"returned {type(items).__name__}, not a map-style dataset (needs __len__ and __getitem__)",
            )
        if len(items) == 0:
            raise ConfigError("data._target_", target, f"the {split} split has no items")
        out.append(ItemDataset(items, collate_fn, target))
    return out[0], out[1]


def _call_user(instantiate: Callable[..., Any], node: dict[str, Any]) -> Any:
    """``instantiate(node)``; an exception the user's code raised propagates as itself, with its traceback.

    Hydra wraps it in an InstantiationException whose message is the user's repr squashed into a string;
    every target was located beforehand, so the wrapped cause can only come from the user's own code.
    """
    from hydra.errors import InstantiationException

    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as err:
        if err.__cause__ is None:
            raise
        users = err.__cause__
    raise users  # outside the except block: no "during handling of ..." chain back to hydra's wrapper


def _locate_nested(key: str, node: Any) -> None:
    """Import every ``_target_`` inside ``node`` so a typo is a one-line ConfigError naming its key."""
    if isinstance(node, Mapping):  # a dict, or an omegaconf DictConfig
        if isinstance(node.get("_target_"), str):
            locate(f"{key}._target_", node["_target_"])
        for name, value in node.items():
            _locate_nested(f"{key}.{name}", value)
    elif isinstance(node, Sequence) and not isinstance(node, str):
        for i, value in enumerate(node):
            _locate_nested(f"{key}[{i}]", value)
