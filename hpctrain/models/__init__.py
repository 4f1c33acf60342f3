"""Models. Importing this package does not import torch (``spec`` and ``flops`` are used on the submit
path); ``build_model`` imports the model's code when called."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpctrain.config.schema import ModelConfig
from hpctrain.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn

__all__ = ["build_model"]


def build_model(model: ModelConfig | ModelSpec, random_init: bool = True) -> nn.Module:
    """Call ``model.target`` with ``model.args`` (nested ``_target_``s instantiated first, as Hydra's
    ``instantiate`` does), initialised from torch's current RNG. Built-in or not, the same call.

    ``random_init=False`` (a run that loads a checkpoint over every weight): ``torch.nn.init``'s random
    initialisers fill parameters with zeros instead while the model is built, as transformers'
    ``no_init_weights`` skips them for ``from_pretrained``: GPT-2 small's build 1.3-1.6 → 0.16-0.22 s here,
    and an init that takes minutes for a large model on CPU. Zeros, not the uninitialised memory: a
    throwaway step before the load (DDP's bucket priming) sees no NaN. Only parameters (a checkpoint holds
    every one): a plain tensor given to an initialiser (a buffer drawn at random, perhaps not saved: random
    features) is drawn as ever, as is whatever the model computes itself (LayerNorm's ones, its own
    ``Tensor.normal_``)."""
    from hydra.utils import instantiate
    from torch import nn

    if isinstance(model, ModelSpec):
        model = model.to_model_config()
    with contextlib.nullcontext() if random_init else _zeros_for_random_init():
        built = instantiate({"_target_": model.target, **model.args}, _convert_="all")
    if not isinstance(built, nn.Module):
        raise TypeError(f"model._target_={model.target} returned {type(built).__name__}, not an nn.Module")
    return built


# torch.nn.init's random initialisers, the names transformers' no_init_weights replaces (those without the
# trailing underscore are deprecated aliases).
RANDOM_INITS = (
    "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "orthogonal_", "sparse_", "uniform", "normal", "xavier_uniform", "xavier_normal",
    "kaiming_uniform", "kaiming_normal",
)  # fmt: skip


@contextlib.contextmanager
def _zeros_for_random_init() -> Iterator[None]:
    import torch

    def skipping(original: Any) -> Any:
        def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if not isinstance(tensor, torch.nn.Parameter):  # a buffer drawn at random, maybe not saved
                return original(tensor, *args, **kwargs)
            with torch.no_grad():
                return tensor.zero_()

        return init

    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_INITS if hasattr(torch.nn.init, name)}
    try:
        for name, original in saved.items():
            setattr(torch.nn.init, name, skipping(original))
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)
