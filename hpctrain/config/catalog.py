"""What each dataset yields, so a config can be checked against its model before anything runs.

Must not import torch (nor numpy): config validation on the submit path uses it. The rules that combine
these facts with a model live in :func:`hpctrain.config.validate.check_data`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# What a dataset yields: token sequences, images, or whatever the model takes ("any": synthetic data is
# shaped by the model).
DATASET_KINDS: dict[str, str] = {"synthetic": "any", "text": "tokens", "digits": "images", "tokens": "tokens"}
MODEL_INPUT_KIND: dict[str, str] = {"gpt": "tokens", "vit": "images"}

# Byte-level text: every byte value is a token.
TEXT_VOCAB = 256
# scikit-learn's load_digits: 8×8 grey images of the digits 0–9.
DIGITS_SHAPE = (1, 8, 8, 10)


def fixed_image_shape(name: str) -> tuple[int, int, int, int] | None:
    """``(C, H, W, num_classes)`` of a dataset whose images have a fixed shape, else None."""
    return DIGITS_SHAPE if name == "digits" else None


def fixed_vocab(name: str) -> int | None:
    """Vocabulary size of a dataset whose tokens are fixed by the dataset itself, else None."""
    return TEXT_VOCAB if name == "text" else None


def read_token_header(path: str | Path) -> dict[str, Any]:
    """The JSON header next to a token file ``<name>.bin`` (``<name>.json``), unvalidated."""
    header = Path(path).with_suffix(".json")
    with open(header, encoding="utf-8") as f:
        return json.load(f)
