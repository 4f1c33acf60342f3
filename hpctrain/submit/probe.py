"""Try a run's model, data and loss before anything starts: one line naming the key for each problem.

A model that declares its facts (the built-ins, :mod:`hpctrain.models.spec`) with built-in data and the
default loss needs none of this: their rules are torch-free. Anything else is tried here, on the submitting
machine: the ``_target_`` is imported, its arguments bound to its signature, the model built on the meta
device (no memory, no initialisation cost), two items of the training set collated, and the model and the
loss run on that batch moved to the meta device (shapes and dtypes only). Errors of the user's own code
are theirs and keep their traceback; everything else is a :class:`ConfigError`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from hpctrain.config.schema import Config
from hpctrain.config.typed import locate
from hpctrain.errors import ConfigError, UserCodeError
from hpctrain.models.builtin import BUILTIN

log = logging.getLogger(__name__)
DEFAULT_LOSS = "hpctrain.train.loss.cross_entropy"
LABEL_SCAN = 64  # items whose labels are checked against the model's output width before anything starts


def needs_probe(cfg: Config) -> bool:
    declared = cfg.model.target in BUILTIN and cfg.data.target is None and cfg.loss.target == DEFAULT_LOSS
    return not declared or bool(cfg.parallel.block_classes) or bool(cfg.parallel.tp_plan)


def check_arguments(
    key: str, fn: Any, target: str, args: dict[str, Any], extra: tuple[str, ...] = ()
) -> None:
    """Bind ``args`` (plus the ``extra`` names hpctrain passes) to ``fn``'s signature: a missing or unknown
    argument is one line, before the user's code runs."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: its own error will say
    try:
        signature.bind(**dict.fromkeys(extra), **args)
    except TypeError as err:
        raise ConfigError(key, target, f"cannot take its arguments: {err}") from None


def probe(cfg: Config) -> None:
    """Build the model on the meta device and run it and the loss on one collated batch; raise a
    ConfigError for a mismatch, let the user's own exceptions through."""
    import torch

    from hpctrain.train.loss import build_objective, to_device

    model = build_model(cfg, "meta")
    split = check_splits(cfg, model)
    if cfg.parallel.block_classes:  # names that match nothing: one line now, not a traceback on every rank
        from hpctrain.parallel.blocks import find_blocks

        find_blocks(model, cfg.parallel.block_classes)
    train_set = training_set(cfg)
    if cfg.data.target is not None:
        check_enough_items(cfg, len(train_set))
    batch, scanned = first_batches(cfg, [2, LABEL_SCAN], train_set)
    objective = build_objective(cfg.loss, cfg.data)
    batch = to_device(batch, torch.device("meta"))
    try:
        outputs = objective.outputs(model, batch)
    except Exception as err:
        if _meta_limitation(err):
            log.info(
                "model %s cannot run on the meta device (%s): checked when training starts",
                cfg.model.target,
                err,
            )
            return
        if objective.with_targets:  # loss=model: the model is handed the labels too, which it may not take
            raise ConfigError(
                "loss",
                "model",
                f"model {cfg.model.target} does not compute its own loss from a whole batch (labels "
                f"included): {_first_line(err)}",
                valid="a loss of outputs and targets, e.g. loss=cross_entropy",
            ) from None
        raise ConfigError(
            "data",
            cfg.data.target or cfg.data.name,
            f"a batch of it cannot go through model {cfg.model.target}: {_first_line(err)}",
        ) from None
    if cfg.loss.target == DEFAULT_LOSS and not objective.with_targets:
        check_labels(cfg, outputs, scanned, objective.target_key)
    if split is not None:
        from hpctrain.parallel.stages import check_split_runs
        from hpctrain.train.loss import pipeline_pair

        inputs, _ = pipeline_pair(batch, objective.target_key)
        check_split_runs(model, split, inputs)
        if objective.with_targets:
            raise ConfigError(
                "loss",
                "model",
                "under pipeline parallelism the last stage computes the loss from the logits",
                valid="a loss of outputs and targets, e.g. loss=cross_entropy",
            )
    try:
        loss = objective.loss(outputs, batch)
    except Exception as err:
        raise ConfigError(
            "loss._target_", cfg.loss.target, f"cannot read the model's output: {_first_line(err)}"
        ) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ConfigError("loss._target_", cfg.loss.target, f"returned {shape}, not a scalar tensor")
    if not loss.is_floating_point():  # backward() has nothing to differentiate in an integer tensor
        raise ConfigError(
            "loss._target_",
            cfg.loss.target,
            f"returned a {loss.dtype} tensor, which has no gradient",
            valid="a floating-point scalar computed from the model's output",
        )
    if not any(p.requires_grad for p in model.parameters()):  # the optimizer would get an empty list
        raise ConfigError(
            "model._target_",
            cfg.model.target,
            "has no trainable parameters: nothing to train",
            valid="a model with parameters (requires_grad=True)",
        )
    if not loss.requires_grad:
        raise ConfigError(
            "loss._target_",
            cfg.loss.target,
            "returned a tensor that does not depend on the model's output (no gradient reaches the model)",
            valid="a scalar computed from the model's output",
        )


def check_init_from_fits(cfg: Config) -> None:
    """``model.init_from``'s names and shapes against the model built on the meta device, read from the
    weights' headers: a mismatch is one line before anything starts, not a failure on every rank."""
    from pathlib import Path

    from hpctrain.weights.load import check_weights_fit

    if cfg.model.init_from is None:
        return
    model = build_model(cfg, "meta")
    check_weights_fit(model, Path(cfg.model.init_from), cfg.model.init_strict)


def check_labels(cfg: Config, outputs: Any, batch: Any, target_key: str) -> None:
    """Class labels (integer targets) of the first items within the width of the model's output (logits on
    the meta device: only the shape is read), ``-100`` ignored as cross-entropy ignores it: a label out of
    range is one line now, not an index error on every rank after the workers started."""
    import torch

    from hpctrain.models.outputs import logits_of
    from hpctrain.train.loss import IGNORE_INDEX, targets_of

    try:
        width = int(logits_of(outputs).shape[-1])
        targets = targets_of(batch, target_key)
    except (TypeError, KeyError, IndexError):
        return  # the loss check below says what does not fit
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.numel() == 0:
        return
    counted = targets[targets != IGNORE_INDEX]
    if counted.numel() == 0:
        return
    low, high = int(counted.min()), int(counted.max())
    if low < 0 or high >= width:
        bad = low if low < 0 else high
        raise ConfigError(
            "data._target_" if cfg.data.target is not None else "data",
            cfg.data.target or cfg.data.name,
            f"label {bad} among its first {LABEL_SCAN} items is outside model {cfg.model.target}'s "
            f"{width} outputs (classes 0..{width - 1})",
            valid=f"labels 0..{width - 1} ({IGNORE_INDEX} is ignored), or a model with more outputs "
            "(e.g. its num_classes)",
        )


def build_model(cfg: Config, device: str) -> Any:
    """The run's model built on ``device`` ("meta": shapes and dtypes only, no memory, no initialisation),
    its arguments checked first; a ConfigError for anything but an ``nn.Module``, a UserCodeError (with the
    user's traceback) for an exception of the user's code."""
    import torch
    from hydra.utils import instantiate
    from torch import nn

    _quiet_torch_logs()
    factory = locate("model._target_", cfg.model.target)
    check_arguments("model._target_", factory, cfg.model.target, _top_level(cfg.model.args))
    locate("loss._target_", cfg.loss.target)
    if cfg.data.target is not None:
        check_arguments(
            "data._target_",
            locate("data._target_", cfg.data.target),
            cfg.data.target,
            _top_level(cfg.data.args),
            extra=("split",),
        )
    with torch.device(device):
        model = user_call(
            "model._target_",
            cfg.model.target,
            lambda: instantiate({"_target_": cfg.model.target, **cfg.model.args}, _convert_="all"),
        )
    if not isinstance(model, nn.Module):
        raise ConfigError(
            "model._target_", cfg.model.target, f"returned {type(model).__name__}, not an nn.Module"
        )
    return model


def training_set(cfg: Config) -> Any:
    """The run's training set, built here (a user's dataset through :func:`user_call`)."""
    from hpctrain.data import build_datasets
    from hpctrain.data.user import build_user_datasets
    from hpctrain.models.builtin import model_spec

    _quiet_torch_logs()
    if cfg.data.target is not None:
        train_set, _ = user_call(
            "data._target_",
            cfg.data.target,
            lambda: build_user_datasets(cfg.data.target, cfg.data.args, cfg.data.collate),
        )
    else:
        train_set, _ = build_datasets(cfg.data, model_spec(cfg.model), cfg.trainer.seed)
    return train_set


def check_enough_items(cfg: Config, items: int) -> None:
    """A training split smaller than one global batch would repeat items within every step: refused."""
    from hpctrain.config.shape import run_shape

    batch = run_shape(cfg).global_batch_size
    if items < batch:
        raise ConfigError(
            "data._target_",
            cfg.data.target,
            f"its train split has {items} items, fewer than one global batch of {batch}",
            valid=f"more items, or a global batch of at most {items} (trainer.micro_batch_size, processes)",
        )


def first_batches(cfg: Config, sizes: list[int], train_set: Any = None) -> list[Any]:
    """For each of ``sizes``, that many first items of the training set, collated as the trainer collates
    them (on the CPU; the dataset is built once, or given)."""
    if train_set is None:
        train_set = training_set(cfg)
    key = "data._target_" if cfg.data.target is not None else "data"
    name = cfg.data.target or cfg.data.name or ""
    return [
        user_call(key, name, lambda n=n: train_set.get_batch([i % len(train_set) for i in range(n)]))
        for n in sizes
    ]


def check_splits(cfg: Config, model: Any) -> Any:
    """Whether the model can be split as the layout asks: a tensor-parallel plan whose patterns name its
    modules, a pipeline split (returned when the model does not split itself, to be tried on a batch)."""
    from hpctrain.config.shape import run_shape

    shape = run_shape(cfg)
    if shape.degrees.tp > 1:
        from hpctrain.parallel.tp import require_tp_plan

        require_tp_plan(model, dict(cfg.parallel.tp_plan), shape.degrees.tp)
    if shape.degrees.pp > 1:
        from hpctrain.parallel.stages import require_split

        return require_split(model, dict(cfg.parallel.pp_split), shape.n_stages)
    return None


def _quiet_torch_logs() -> None:
    """Libraries a user's model or data imports (torchao through transformers) register enums in a way torch
    now calls deprecated, one log line each on the console of a user who can do nothing about it: not shown
    here. Called before the user's code is imported."""
    from hpctrain import torchapi

    torchapi.quiet_pytree_log()


def user_call(key: str, target: str, fn: Any) -> Any:
    """``fn()``, turning an exception raised by the user's code into a UserCodeError."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as err:
        cause = err
        while cause.__cause__ is not None and type(cause).__name__ == "InstantiationException":
            cause = cause.__cause__  # Hydra's wrapper: the user's own exception is its cause
        raise UserCodeError(key, target, cause) from None


def _top_level(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if not k.startswith("_")}


def _meta_limitation(err: Exception) -> bool:
    text = str(err)
    return "meta" in text and ("tensor" in text.lower() or "device" in text.lower()) and "shape" not in text


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]
