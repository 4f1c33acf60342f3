"""The built-in datasets as facts: what each yields, whether it needs a file of the user's, its fixed
image shape or vocabulary; and the token files' header format. The data group's own rules and whether a
dataset can feed a model (:meth:`hpctrain.models.spec.ModelSpec.accepts`) are checked here, before anything
runs.

Must not import torch (nor numpy): the submit path uses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config.schema import DataConfig
from hpctrain.errors import ConfigError

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


ANY = "any"  # a dataset shaped by the model: it yields whatever the model takes


@dataclass(frozen=True)
class DatasetSpec:
    """What built-in dataset ``name`` yields: ``gives`` is a model input kind (what
    :attr:`hpctrain.models.spec.ModelSpec.input_kind` names) or :data:`ANY`."""

    name: str
    gives: str
    needs_file: bool = False  # data.path: a token file of the user's
    image_shape: tuple[int, int, int, int] | None = None  # (C, H, W, classes), when fixed
    vocab: int | None = None  # the vocabulary, when the dataset fixes it


# The built-in datasets (conf/data/*.yaml). A model's default is the first that feeds it, those shaped by
# the model last.
DATASETS: dict[str, DatasetSpec] = {
    "synthetic": DatasetSpec("synthetic", ANY),
    "text": DatasetSpec("text", "tokens", vocab=TEXT_VOCAB),
    "digits": DatasetSpec("digits", "images", image_shape=DIGITS_SHAPE),
    "tokens": DatasetSpec("tokens", "tokens", needs_file=True),
}


def dataset_gives(name: str) -> str:
    """What built-in dataset ``name`` yields (:data:`ANY` for a name that is none of them)."""
    found = DATASETS.get(name)
    return found.gives if found else ANY


def fixed_image_shape(name: str) -> tuple[int, int, int, int] | None:
    """``(C, H, W, num_classes)`` of a dataset whose images have a fixed shape, else None."""
    found = DATASETS.get(name)
    return found.image_shape if found else None


def fixed_vocab(name: str) -> int | None:
    """Vocabulary size of a dataset whose tokens are fixed by the dataset itself, else None."""
    found = DATASETS.get(name)
    return found.vocab if found else None


WINDOWED = ("text", "tokens")  # the built-ins that cut token windows (data.seq_len)


def check_builtin_data(data: DataConfig) -> None:
    """The built-in dataset's own keys: a known name and its numbers (a user's dataset, ``data._target_``, is
    checked on a real item by :mod:`hpctrain.submit.probe`)."""
    if data.target is not None:
        return
    if data.name not in DATASETS:
        raise ConfigError("data", data.name, "not a known choice", valid=", ".join(DATASETS))
    if data.path is not None and not DATASETS[data.name].needs_file:
        # Refused, not honoured: the built-ins other than tokens are fixed corpora (text: Python's own
        # sources), and a user's text becomes a token file with `hpctrain prepare` first.
        raise ConfigError(
            "data.path",
            data.path,
            f"data={data.name} reads no file, so it would be ignored",
            valid="leave it unset, or data=tokens with a .bin written by `hpctrain prepare`",
        )
    if not 0.0 < data.val_fraction <= 0.5:
        raise ConfigError("data.val_fraction", data.val_fraction, "must be in (0, 0.5]")
    for key, value, low in (("num_samples", data.num_samples, 2), ("max_bytes", data.max_bytes, 1024)):
        if value < low:
            raise ConfigError(f"data.{key}", value, f"must be ≥ {low}")
    if data.seq_len is not None:
        if data.seq_len < 1:
            raise ConfigError("data.seq_len", data.seq_len, "must be ≥ 1")
        if data.name not in WINDOWED:
            raise ConfigError(
                "data.seq_len",
                data.seq_len,
                f"data={data.name} cuts no token windows",
                valid=f"leave it unset, or data={' or data='.join(WINDOWED)}",
            )


def dataset_facts(
    data: DataConfig,
) -> tuple[str, tuple[int, int, int, int] | None, int | None, int | None]:
    """What built-in dataset ``data`` yields: (what it gives, fixed image shape or None, vocabulary or None,
    tokens or None); a token file's vocabulary and length are read from its header, once (a ConfigError when
    there is no usable file)."""
    spec = DATASETS[str(data.name)]
    if not spec.needs_file:
        return spec.gives, spec.image_shape, spec.vocab, None
    header = _token_file_header(data.path)
    return spec.gives, spec.image_shape, int(header["vocab_size"]), int(header["num_tokens"])


def check_feeds(data: DataConfig, model: Any) -> None:
    """Whether built-in dataset ``data`` can feed ``model`` (a ModelSpec): what it gives, then the model's own
    rules on the image shape or vocabulary. A one-line ConfigError naming what fits otherwise."""
    gives, image_shape, vocab, tokens = dataset_facts(data)
    if not model.accepts(gives):
        fitting = [d.name for d in DATASETS.values() if model.accepts(d.gives)]
        raise ConfigError(
            "data",
            data.name,
            f"gives {gives} but model {model.name} takes {model.input_kind}",
            valid=", ".join(fitting) + ", or data._target_=...",
        )
    model.check_data(str(data.name), image_shape, vocab)
    declared = model.context_length
    window = data.seq_len or declared
    # As datasets.build_datasets cuts the file: a window to train on and one to check.
    if tokens is not None and window is not None and (tokens - 1) // window < 2:
        raise ConfigError(
            "data.path",
            data.path,
            f"holds {tokens} tokens: fewer than 2 windows of {window} + 1 (one to train, one to check)",
            valid=f"a file of at least {2 * window + 1} tokens, or a shorter data.seq_len",
        )
    if data.seq_len is not None and declared is not None and data.seq_len != declared:
        if model.transformer:  # a built-in's positions are its model.seq_len
            raise ConfigError(
                "data.seq_len",
                data.seq_len,
                f"model {model.name} takes windows of model.seq_len={declared}",
                valid=f"model.seq_len={data.seq_len}, or leave data.seq_len unset",
            )
        if data.seq_len > declared:
            raise ConfigError(
                "data.seq_len",
                data.seq_len,
                f"is longer than model {model.name}'s {declared} positions",
                valid=f"1..{declared}",
            )


def spec_of(data: DataConfig) -> Any:
    return DATASETS[str(data.name)]


def default_for(model: Any) -> str | None:
    """The first built-in dataset, needing no file of the user's, that can feed ``model`` (a ModelSpec):
    one of the kind it takes, else one shaped by it; None when none can."""
    ordered = sorted(DATASETS.values(), key=lambda d: d.gives == ANY)
    for candidate in ordered:
        if candidate.needs_file:
            continue
        try:
            check_feeds(DataConfig(name=candidate.name), model)
        except ConfigError:
            continue
        return candidate.name
    return None


def _token_file_header(path: str | None) -> dict[str, Any]:
    if path is None or path == "???":
        raise ConfigError(
            "data.path", path, "required for data=tokens", valid="a .bin written by `hpctrain prepare`"
        )
    header = Path(path).with_suffix(".json")
    if not Path(path).is_file() or not header.is_file():
        raise ConfigError(
            "data.path", path, f"no token file there (need {Path(path).name} and {header.name})"
        )
    try:
        return read_token_header(path)
    except (ValueError, OSError) as err:
        raise ConfigError("data.path", path, f"not a usable token file: {err}") from None


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
