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

# Token files (``hpctrain prepare``, hpctrain.data.tokenfile): PATH.bin of little-endian ids and PATH.json.
# Version 2 adds the header's "tokenizer" entry (null, {"kind": "bytes"}, or {"kind": "tokenizers", "file":
# NAME, "sha256": HEX, "vocab_size": V} for a tokenizers JSON file beside the .bin); version 1 is still read.
TOKEN_FORMAT = "hpctrain-tokens"
TOKEN_VERSION = 2
TOKEN_VERSIONS = (1, 2)
TOKENIZER_KINDS = ("bytes", "tokenizers")
TOKEN_ITEMSIZE = {"uint16": 2, "uint32": 4}

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
    """Load and validate the header of token file ``path`` (.bin) against the file's size."""
    path = Path(path)
    hpath = path.with_suffix(".json")
    if not path.is_file():
        raise FileNotFoundError(f"token file {path} not found (write one with `hpctrain prepare`)")
    if not hpath.is_file():
        raise FileNotFoundError(f"token file header {hpath} not found next to {path}")
    try:
        header = json.loads(hpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"token file header {hpath} is not valid JSON: {e}") from e
    if not isinstance(header, dict) or header.get("format") != TOKEN_FORMAT:
        raise ValueError(f"{hpath} is not an {TOKEN_FORMAT} header")
    version = header.get("version")
    if isinstance(version, bool) or version not in TOKEN_VERSIONS:
        raise ValueError(
            f"{hpath} has version {version!r}; valid: {' or '.join(map(str, TOKEN_VERSIONS))} "
            "(write the file again with this hpctrain's `hpctrain prepare`)"
        )
    _check_tokenizer_entry(hpath, header)
    if header.get("dtype") not in TOKEN_ITEMSIZE:
        raise ValueError(
            f"{hpath} has dtype {header.get('dtype')!r}; expected one of {sorted(TOKEN_ITEMSIZE)}"
        )
    for key in ("vocab_size", "num_tokens"):
        if not isinstance(header.get(key), int) or isinstance(header[key], bool) or header[key] < 0:
            raise ValueError(f"{hpath} has {key}={header.get(key)!r}; expected a non-negative integer")
    itemsize = TOKEN_ITEMSIZE[header["dtype"]]
    expected = header["num_tokens"] * itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise ValueError(
            f"token file {path} has {actual} bytes but its header says num_tokens={header['num_tokens']} "
            f"× {itemsize} bytes ({header['dtype']}) = {expected} bytes"
        )
    return header


def _check_tokenizer_entry(hpath: Path, header: dict[str, Any]) -> None:
    """A version-2 header's "tokenizer" (version 1 has none): null, bytes, or a tokenizers file beside it."""
    if header["version"] < 2:
        header.setdefault("tokenizer", None)
        return
    entry = header.get("tokenizer")
    if entry is None:
        return
    kind = entry.get("kind") if isinstance(entry, dict) else None
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"{hpath} has tokenizer {entry!r}; expected null or a kind in {TOKENIZER_KINDS}")
    if kind == "tokenizers":
        name = entry.get("file")
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise ValueError(f"{hpath} has tokenizer file {name!r}; expected a file name beside it")
        if not isinstance(entry.get("sha256"), str):
            raise ValueError(f"{hpath} has tokenizer sha256 {entry.get('sha256')!r}; expected a hex string")
