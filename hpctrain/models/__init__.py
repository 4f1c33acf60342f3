"""Models. Importing this package does not import torch (``spec`` and ``flops`` are used on the submit
path); ``build_model`` imports the model's code when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.config.schema import ModelConfig
from hpctrain.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn

__all__ = ["build_model"]


def build_model(model: ModelConfig | ModelSpec) -> nn.Module:
    """Call ``model.target`` with ``model.args`` (nested ``_target_``s instantiated first, as Hydra's
    ``instantiate`` does), initialised from torch's current RNG. Built-in or not, the same call."""
    from hydra.utils import instantiate
    from torch import nn

    if isinstance(model, ModelSpec):
        model = model.to_model_config()
    built = instantiate({"_target_": model.target, **model.args}, _convert_="all")
    if not isinstance(built, nn.Module):
        raise TypeError(f"model._target_={model.target} returned {type(built).__name__}, not an nn.Module")
    return built
