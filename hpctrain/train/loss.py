"""Batches, model calls and losses for any model: hpctrain's one convention, written once.

A batch is what the dataset's collate made of its items: a pair ``(input, target)`` or a dict of tensors.
The model is called with ``input`` (a pair) or with the dict's keys as keyword arguments, the targets
(``data.target_key``) left out unless the model computes its own loss (``loss=model``). Its output may be a
tensor of logits, a dict, or an object with ``.logits`` / ``.loss`` (transformers' ModelOutput). The loss is
a callable ``(outputs, batch) -> scalar tensor``: by default cross-entropy over the last dimension with
``ignore_index=-100`` (transformers' label convention).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.config.schema import DataConfig, LossConfig
from hpctrain.models.outputs import logits_of

IGNORE_INDEX = -100
Loss = Callable[[Any, Any], torch.Tensor]


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def targets_of(batch: Any, target_key: str = "labels") -> Any:
    """The targets of a batch: the second element of a pair, or ``batch[target_key]``."""
    return batch[target_key] if isinstance(batch, dict) else batch[1]


def inputs_of(batch: Any) -> Any:
    """The model's main input (for shape facts and DDP's priming pass): a pair's first element, or the
    dict's first non-target tensor."""
    if isinstance(batch, dict):
        return next(iter(batch.values()))
    return batch[0]


def pipeline_pair(batch: Any, target_key: str = "labels") -> tuple[Any, Any]:
    """(input, targets) of a batch for a pipeline, whose first stage takes one tensor: a pair as it is, a
    dict's one tensor besides the targets."""
    if not isinstance(batch, dict):
        return batch[0], batch[1]
    inputs = [key for key in batch if key != target_key]
    if len(inputs) != 1:
        from hpctrain.errors import ConfigError

        raise ConfigError(
            "parallel.pp",
            "batch",
            f"a pipeline's first stage takes one input tensor; the batch holds {inputs} "
            f"besides data.target_key={target_key}",
            valid="a dataset whose items hold one input and the targets",
        )
    return batch[inputs[0]], batch[target_key]


def call_model(model: nn.Module, batch: Any, target_key: str, with_targets: bool) -> Any:
    """``model(input)`` for a pair; ``model(**batch)`` for a dict, without the targets unless asked."""
    if isinstance(batch, dict):
        kwargs = batch if with_targets else {k: v for k, v in batch.items() if k != target_key}
        return model(**kwargs)
    if with_targets:
        return model(batch[0], batch[1])
    return model(batch[0])


def cross_entropy(
    outputs: Any, batch: Any, target_key: str = "labels", ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Mean cross-entropy of the logits' last dimension against the targets (each token for a language
    model, each sample for a classifier), in fp32; targets equal to ``ignore_index`` count for nothing."""
    logits, targets = logits_of(outputs), targets_of(batch, target_key)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"the logits have shape {tuple(logits.shape)} and the targets {tuple(targets.shape)}: "
            "cross-entropy needs targets shaped like the logits without their last (class) dimension"
        )
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index)


def model_loss(outputs: Any, batch: Any) -> torch.Tensor:
    """The loss the model computed from the batch, labels included (``outputs.loss`` or ``["loss"]``)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"loss=model, but the model returned {type(outputs).__name__} without a .loss tensor "
            "(it must compute its loss when called with the targets)"
        )
    return loss


model_loss.model_computes_loss = True  # type: ignore[attr-defined]


def build_loss(loss: LossConfig, data: DataConfig) -> Loss:
    """The run's loss: ``loss.target`` with ``loss.args`` bound. A loss that takes a ``target_key`` argument
    gets the data group's (unless given)."""
    from hydra.utils import get_object

    fn = get_object(loss.target)
    if inspect.isclass(fn):  # a class: its instance is the callable
        fn = fn(**loss.args)
        args: dict[str, Any] = {}
    else:
        args = dict(loss.args)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # a builtin without a signature: called as given
    if "target_key" in params and "target_key" not in args:
        args["target_key"] = data.target_key
    bound = functools.partial(fn, **args) if args else fn
    return bound


def computes_own_loss(loss_fn: Loss) -> bool:
    """Whether the model must be called with the targets (``loss=model``)."""
    fn = loss_fn.func if isinstance(loss_fn, functools.partial) else loss_fn
    return bool(getattr(fn, "model_computes_loss", False))


def class_accuracy(outputs: Any, batch: Any, target_key: str) -> tuple[float, int] | None:
    """(correct, count) when the targets are one class label per sample, else None (e.g. per-token ids)."""
    try:
        logits = logits_of(outputs)
    except TypeError:
        return None
    targets = targets_of(batch, target_key)
    if not isinstance(targets, torch.Tensor) or targets.dim() != 1 or targets.is_floating_point():
        return None
    if logits.dim() != 2 or logits.shape[0] != targets.shape[0]:
        return None
    return float((logits.argmax(-1) == targets).sum()), int(targets.numel())


class Objective:
    """What one pass computes: call the model on a batch the run's way, then the run's loss."""

    def __init__(self, loss: Loss = cross_entropy, target_key: str = "labels") -> None:
        self.loss = loss
        self.target_key = target_key
        self.with_targets = computes_own_loss(loss)

    def outputs(self, model: nn.Module, batch: Any) -> Any:
        return call_model(model, batch, self.target_key, self.with_targets)

    def __call__(self, model: nn.Module, batch: Any) -> tuple[Any, torch.Tensor]:
        """(outputs, loss) of ``model`` on ``batch``."""
        outputs = self.outputs(model, batch)
        return outputs, self.loss(outputs, batch)


def build_objective(loss: LossConfig, data: DataConfig) -> Objective:
    return Objective(build_loss(loss, data), data.target_key)
