"""Whether a checkpoint fits the model it would be loaded into: every model tensor's name and global shape,
compared before anything is loaded, written or pruned (``CheckpointMismatch``, one line, else nothing)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.ranks import gather_over_ranks
from hpctrain.errors import START_FRESH, CheckpointMismatch


def refuse_mismatch(directory: Path, saved: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Raise ``CheckpointMismatch`` naming the first model tensor whose name or shape differs between the
    checkpoint and this run (states that offer ``model_shapes()``: {parameter name: global shape})."""
    for key, stateful in state.items():
        shapes = getattr(stateful, "model_shapes", None)
        if shapes is None:
            continue
        prefix = f"{key}.model."
        mine = {f"{prefix}{name}": tuple(shape) for name, shape in whole_model(shapes()).items()}
        # A tied parameter's second name (saved by hpctrain before it saved each weight once) is not loaded.
        aliases = {f"{prefix}{name}" for name in getattr(stateful, "saved_names", {})}
        theirs = {
            k: tuple(getattr(v, "size", ()))
            for k, v in saved.items()
            if k.startswith(prefix) and hasattr(v, "size") and k not in aliases
        }
        for name in sorted(mine.keys() | theirs.keys()):
            if mine.get(name) == theirs.get(name):
                continue
            what = name[len(prefix) :]
            if name not in theirs:
                detail = f"{what} is in the model {list(mine[name])} but not in the checkpoint"
            elif name not in mine:
                detail = f"{what} is in the checkpoint {list(theirs[name])} but not in the model"
            else:
                shapes_of = f"{list(theirs[name])} in the checkpoint, {list(mine[name])} in the model"
                detail = f"{what} has shape {shapes_of}"
            raise CheckpointMismatch(
                f"checkpoint {directory} does not match the model: {detail}; nothing was loaded or deleted; "
                f"{START_FRESH}"
            )


def whole_model(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The union of every rank's model tensors: a pipeline stage holds only part of the model, which a
    checkpoint of the whole model must not be refused for. Collective when several ranks run."""
    every = gather_over_ranks(shapes, None)
    return {name: shape for part in every if part for name, shape in part.items()}
