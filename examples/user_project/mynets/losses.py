"""A loss of one's own: hpctrain calls it as ``fn(outputs, batch, **its arguments)``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def label_smoothing_ce(outputs: Any, batch: Any, smoothing: float = 0.1) -> torch.Tensor:
    """Cross-entropy with label smoothing (Szegedy et al. 2016, section 7)."""
    logits = outputs if isinstance(outputs, torch.Tensor) else outputs.logits
    targets = batch["labels"] if isinstance(batch, dict) else batch[1]
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), label_smoothing=smoothing)
