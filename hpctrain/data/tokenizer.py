"""Tokenizers of token files: the ``--tokenizer`` of ``hpctrain prepare`` and :func:`tokenizer_for`.

``bytes``: every byte is a token (vocab 256); text is taken byte for byte, whatever its encoding.
``PATH/tokenizer.json``: a Hugging Face ``tokenizers`` JSON file of your own. ``train:VOCAB``: a byte-level
BPE (GPT-2's pre-tokenizer, ``tokenizers``' BpeTrainer) with at most VOCAB ids, trained on the corpus.
Text given to a ``tokenizers`` tokenizer is decoded as UTF-8 (a byte that is not becomes U+FFFD).

The tokenizer is saved beside the token file (``<name>.tokenizer.json``) and named in its header with its
sha256, so whatever reads the token file later finds the same tokenizer: ``tokenizer_for("corpus.bin")``.
``tokenizers`` is imported only where one is used (it is the ``hf`` extra).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from hpctrain.data.catalog import TEXT_VOCAB, read_token_header
from hpctrain.errors import ConfigError

MIN_TRAIN_VOCAB = TEXT_VOCAB  # the byte alphabet: a byte-level BPE has at least these
MAX_TRAIN_VOCAB = 2**20
VALID = f"bytes, PATH/tokenizer.json, or train:VOCAB with {MIN_TRAIN_VOCAB} ≤ VOCAB ≤ {MAX_TRAIN_VOCAB}"


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Spec(NamedTuple):
    """A parsed ``--tokenizer``: kind ``bytes``, ``file`` (path) or ``train`` (vocab)."""

    kind: str
    path: Path | None = None
    vocab: int | None = None


class ByteTokenizer:
    """Every byte of the UTF-8 text is one id; decoding replaces a cut multi-byte character by U+FFFD."""

    vocab_size = TEXT_VOCAB
    entry: dict[str, Any] = {"kind": "bytes"}  # noqa: RUF012 (read only)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Ids past the bytes (a model whose vocabulary is larger than its data's) have no text: left out.
        return bytes(i for i in ids if 0 <= i < TEXT_VOCAB).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with the two calls hpctrain needs (no special tokens added on encode)."""

    def __init__(self, tok: Any, json_text: str) -> None:
        self.tok, self.json_text = tok, json_text
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json_text.encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=False))


def parse_spec(value: str) -> Spec:
    """``--tokenizer VALUE`` checked without loading anything; a ConfigError (one line) when it is bad."""
    if not value.strip():
        raise ConfigError("--tokenizer", value, "is empty", valid=VALID)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        bad = next(ch for ch in value if ord(ch) < 32 or ord(ch) == 127)
        raise ConfigError("--tokenizer", value, f"holds the control character {bad!r}", valid=VALID)
    if value == "bytes":
        return Spec("bytes")
    if value.startswith("train:"):
        text = value[len("train:") :]
        try:
            vocab = int(text)
        except ValueError:
            reason = f"VOCAB {text!r} is not an integer"
            raise ConfigError("--tokenizer", value, reason, valid=VALID) from None
        if not MIN_TRAIN_VOCAB <= vocab <= MAX_TRAIN_VOCAB:
            raise ConfigError("--tokenizer", value, f"VOCAB {vocab} is out of range", valid=VALID)
        return Spec("train", vocab=vocab)
    path = Path(value)
    if not path.exists():
        raise ConfigError("--tokenizer", value, "no such file", valid=VALID)
    if not path.is_file():
        raise ConfigError("--tokenizer", value, "is not a file", valid=VALID)
    return Spec("file", path=path)


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "--tokenizer", None, "needs the `tokenizers` package", valid="pip install 'hpctrain[hf]'"
        ) from None
    return tokenizers


def from_json(json_text: str, origin: str) -> HFTokenizer:
    """A tokenizer from the text of a ``tokenizers`` JSON file; ``origin`` names it in the error."""
    try:
        tok = _tokenizers().Tokenizer.from_str(json_text)
    except Exception as err:  # tokenizers raises a bare Exception for any bad file
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            "--tokenizer", origin, f"is not a tokenizers JSON file ({first})", valid=VALID
        ) from None
    return HFTokenizer(tok, json_text)


def load_file(path: Path) -> HFTokenizer:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("--tokenizer", str(path), f"cannot be read ({err})", valid=VALID) from None
    return from_json(text, str(path))


def new_bpe(vocab: int) -> tuple[Any, Any]:
    """An untrained byte-level BPE tokenizer and its trainer (at most ``vocab`` ids, the 256 bytes first)."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    return tok, trainer


def header_entry(tok: ByteTokenizer | HFTokenizer, file_name: str) -> dict[str, Any]:
    if isinstance(tok, ByteTokenizer):
        return dict(tok.entry)
    return {"kind": "tokenizers", "file": file_name, "sha256": tok.sha256, "vocab_size": tok.vocab_size}


def tokenizer_for(token_file: str | Path) -> Tokenizer:
    """The tokenizer that wrote token file ``token_file`` (``<name>.bin``), as its header records it.

    A version-1 header names no tokenizer: one of vocabulary 256 is taken as bytes (what version 1 wrote from
    text). A ValueError (one line) when the header records none (another version-1 file, or one made from
    .npy arrays), or when the tokenizer file beside it is missing or is not the one the header names (sha256).
    """
    path = Path(token_file)
    header = read_token_header(path)
    entry = header.get("tokenizer")
    if entry is None and header["version"] == 1 and header["vocab_size"] == TEXT_VOCAB:
        return ByteTokenizer()
    if entry is None:
        raise ValueError(
            f"token file {path} (header version {header['version']}) records no tokenizer; "
            "write it again with `hpctrain prepare --tokenizer ...`"
        )
    if entry["kind"] == "bytes":
        return ByteTokenizer()
    tok_path = path.parent / entry["file"]
    try:
        text = tok_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"tokenizer {tok_path} of token file {path} cannot be read: {err}") from None
    try:
        tok = from_json(text, str(tok_path))
    except ConfigError as err:
        raise ValueError(f"tokenizer {tok_path} of token file {path}: {err.reason}") from None
    if tok.sha256 != entry["sha256"]:
        raise ValueError(
            f"tokenizer {tok_path} has sha256 {tok.sha256[:12]}…, not the {entry['sha256'][:12]}… that "
            f"{path}'s header names: it changed since `hpctrain prepare` wrote it"
        )
    return tok
