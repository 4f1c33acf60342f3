"""Datasets, the global batch sampler and token files.

Exports are loaded lazily (PEP 562) so that importing a torch-free part (``hpctrain.data.sampler``,
``hpctrain.data.tokenfile``) on the submit path does not pull in torch through ``datasets``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.data.datasets import build_datasets
    from hpctrain.data.sampler import GlobalBatchSampler, shard_for_rank, split_micro_batches
    from hpctrain.data.tokenizer import tokenizer_for

__all__ = ["GlobalBatchSampler", "build_datasets", "shard_for_rank", "split_micro_batches", "tokenizer_for"]

_EXPORTS = {
    "build_datasets": "hpctrain.data.datasets",
    "GlobalBatchSampler": "hpctrain.data.sampler",
    "shard_for_rank": "hpctrain.data.sampler",
    "split_micro_batches": "hpctrain.data.sampler",
    "tokenizer_for": "hpctrain.data.tokenizer",  # the tokenizer a token file was written with
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
