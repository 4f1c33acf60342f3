"""What a model returns, read generically: its logits are the output itself, ``output["logits"]`` or
``output.logits`` (transformers' ModelOutput), whatever the model."""

from __future__ import annotations

from typing import Any

import torch


def logits_of(outputs: Any) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, ``outputs["logits"]`` or ``outputs.logits``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and "logits" in outputs:
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise TypeError(
        f"the model returned {type(outputs).__name__}, which holds no logits (a tensor, a dict with "
        "'logits', or an object with .logits); give loss=model if it computes its own loss, or a "
        "loss._target_ that reads it"
    )
