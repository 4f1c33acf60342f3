"""The regime of :mod:`hpctrain.precision` in torch's terms: the autocast context around a forward and
backward, the loss scaler, FSDP's mixed-precision policy, the dtype the planner's measurement casts to,
TF32 for the float32 matmuls that remain, and fp8's float8 Linear layers (torchao)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from hpctrain.errors import ConfigError
from hpctrain.precision import allows_tf32, compute_precision, float8_converts, float8_problem, scales_loss

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_of(precision: str) -> torch.dtype:
    """The dtype ``precision`` computes in outside float8 matmuls (fp8: bfloat16)."""
    return DTYPES[compute_precision(precision)]


def autocast(device: torch.device, precision: str, regime: str) -> contextlib.AbstractContextManager[None]:
    """``torch.autocast`` in ``precision`` under the ``autocast`` regime; nothing otherwise (fp32, or FSDP
    casting the parameters itself)."""
    if regime != "autocast":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype_of(precision))


def autocast_dtype(precision: str, regime: str) -> torch.dtype | None:
    """The dtype autocast computes in, None where there is no autocast."""
    return dtype_of(precision) if regime == "autocast" else None


def grad_scaler(device: torch.device, precision: str, sharded_grads: bool) -> torch.amp.GradScaler:
    """fp16 loss scaling (disabled otherwise). Where ranks hold different gradients (shards, stages), an
    overflow on one must skip the step on all: ShardedGradScaler all-reduces the inf check."""
    enabled = scales_loss(precision)
    if enabled and sharded_grads:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=enabled)


def fsdp_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP's own mixed precision: parameters gathered and used in ``precision`` (fp8: bf16, the float8 casts
    happen inside each Float8Linear); the reduction of gradients stays float32 (fp32 runs: no cast at all)."""
    param_dtype = None if precision == "fp32" else dtype_of(precision)
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def set_matmul_precision(device: torch.device, precision: str) -> None:
    """TF32 for the float32 matmuls and convolutions that remain on a GPU when the run chose less than fp32
    (:func:`hpctrain.precision.allows_tf32`); an fp32 run's stay IEEE float32 (torch's default)."""
    if device.type != "cuda":
        return
    tf32 = allows_tf32(precision)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


# ----------------------------------------------------------------------------------------------- float8
def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device``, None for a device that is not a CUDA GPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def require_float8(device: torch.device) -> None:
    """One line (a ConfigError) when this device cannot train in fp8, before any model is built."""
    problem = float8_problem(device_capability(device), importlib.util.find_spec("torchao") is not None)
    if problem is not None:
        raise ConfigError("trainer.precision", "fp8", problem, valid="fp32, bf16, fp16")


def convert_to_float8(model: nn.Module, within: Sequence[str] = (), emulate: bool = False) -> list[str]:
    """Swap, in place, the ``nn.Linear`` layers of ``model`` that gain from float8
    (:func:`hpctrain.precision.float8_converts`) for torchao's ``Float8Linear`` (tensor-wise dynamic scales,
    torchao's default recipe); ``within``: qualified module names (the model's blocks) outside which nothing
    is converted (empty: anywhere). Parameter names and values stay as they were (the float32 master weights;
    checkpoints load either way). ``emulate``: float8 arithmetic emulated in higher precision (torchao's
    ``emulate``, for machines without float8 tensor cores: tests). Returns the converted layers' names."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    prefixes = tuple(f"{name}." for name in within)
    converted: list[str] = []

    def gains(module: nn.Module, fqn: str) -> bool:
        inside = not prefixes or fqn.startswith(prefixes)
        if inside and isinstance(module, nn.Linear) and float8_converts(*module.weight.shape):
            converted.append(fqn)
            return True
        return False

    convert_to_float8_training(model, module_filter_fn=gains, config=Float8LinearConfig(emulate=emulate))
    log.info("fp8: %d Linear layers run their matmuls in float8", len(converted))
    return converted
