"""What each dataset yields, so a config can be checked against its model before anything runs.

Must not import torch (nor numpy): config validation on the submit path uses it. ``data_cfg`` and
``model_cfg`` may be the schema dataclasses or OmegaConf nodes with the same fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf.errors import MissingMandatoryValue

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


def compatibility_errors(data_cfg: Any, model_cfg: Any, check_files: bool = True) -> list[str]:
    """Human-readable reasons why ``data_cfg`` cannot feed ``model_cfg``; empty when they fit.

    Checks the input kind, fixed image shapes and class counts, and vocabularies. With ``check_files`` a
    token file must exist and its header's vocabulary must fit the model; pass False when the file only
    exists where the job will run.
    """
    name, arch = data_cfg.name, model_cfg.arch
    if name not in DATASET_KINDS:
        return [f"unknown data.name={name!r}; expected one of {sorted(DATASET_KINDS)}"]
    if arch not in MODEL_INPUT_KIND:
        return [f"unknown model.arch={arch!r}; expected one of {sorted(MODEL_INPUT_KIND)}"]
    kind, wants = DATASET_KINDS[name], MODEL_INPUT_KIND[arch]
    if kind not in ("any", wants):
        return [f"data={name} gives {kind} but model.arch={arch} takes {wants}"]

    errors: list[str] = []
    if not 0.0 <= data_cfg.val_fraction < 1.0:
        errors.append(f"data.val_fraction={data_cfg.val_fraction} must be in [0, 1)")
    if name == "synthetic" and data_cfg.num_samples < 2:
        errors.append(f"data.num_samples={data_cfg.num_samples} must be at least 2 (one train, one val)")

    shape = fixed_image_shape(name)
    if shape is not None:
        c, h, w, classes = shape
        if model_cfg.image_size != h or model_cfg.image_size != w:
            errors.append(f"model.image_size={model_cfg.image_size} but data={name} gives {h}×{w} images")
        if model_cfg.in_channels != c:
            errors.append(f"model.in_channels={model_cfg.in_channels} but data={name} has {c} channel(s)")
        if model_cfg.num_classes != classes:
            errors.append(f"model.num_classes={model_cfg.num_classes} but data={name} has {classes} classes")

    vocab = fixed_vocab(name)
    if name == "tokens":
        try:
            path = data_cfg.path
        except MissingMandatoryValue:  # conf/data/tokens.yaml leaves it as ??? for the user to fill in
            path = None
        if not path:
            errors.append("data=tokens needs data.path (a .bin written by `hpctrain prepare`)")
        elif not check_files:
            pass
        elif not Path(path).exists() or not Path(path).with_suffix(".json").exists():
            errors.append(
                f"data.path={path}: token file or its .json header not found "
                "(write one with `hpctrain prepare`)"
            )
        else:
            try:
                vocab = int(read_token_header(path)["vocab_size"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                errors.append(f"data.path={path}: unreadable token file header ({type(e).__name__}: {e})")
    if vocab is not None and model_cfg.vocab_size < vocab:
        errors.append(f"model.vocab_size={model_cfg.vocab_size} but data={name} has a vocabulary of {vocab}")
    return errors
