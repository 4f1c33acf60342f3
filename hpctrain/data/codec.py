"""Text ↔ token ids for tools that read or write text (``hpctrain generate``): the run's own tokenizer.

The built-in text data and the example byte datasets are byte-level (ids 0-255 are UTF-8 bytes); a token
file names its tokenizer in its header when it was made with one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.data.tokenizer import ByteTokenizer, Tokenizer

EXPORT_TOKENIZER = "tokenizer.json"  # an export's copy of the run's tokenizer


def tokenizer_for_data(data: dict[str, Any], export: Path | None = None) -> Tokenizer:
    """The tokenizer of a run's data (``{"name": ..., "path": ...}``): an export's own copy
    (``tokenizer.json``), else a token file's as its header records it, else bytes."""
    from hpctrain.errors import ConfigError

    if export is not None and (export / EXPORT_TOKENIZER).is_file():
        from hpctrain.data.tokenizer import load_file

        return load_file(export / EXPORT_TOKENIZER)
    path = data.get("path")
    if data.get("name") == "tokens" and path:
        from hpctrain.data.tokenizer import tokenizer_for

        try:
            return tokenizer_for(path)
        except (ValueError, OSError) as err:
            raise ConfigError("data.path", path, str(err).splitlines()[0]) from None
    return ByteTokenizer()


def copy_tokenizer(data: dict[str, Any], folder: Path) -> str:
    """Put the run's tokenizer beside exported weights (``tokenizer.json``); what it is: a file or bytes."""
    import shutil

    path = data.get("path")
    if data.get("name") != "tokens" or not path:
        return "bytes"
    from hpctrain.data.tokenfile import tokenizer_path

    source = tokenizer_path(path)
    if not source.is_file():
        return "bytes"
    shutil.copyfile(source, folder / EXPORT_TOKENIZER)
    return EXPORT_TOKENIZER


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (its byte-level BPE's alphabet): the
    printable Latin-1 bytes stand for themselves, the others for the characters from U+0100 on."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def save_hf_tokenizer(data: dict[str, Any], folder: Path) -> str:
    """Write the run's tokenizer as transformers loads it (``AutoTokenizer.from_pretrained(folder)``:
    tokenizer.json and tokenizer_config.json): a token file's own, or for bytes a byte-level tokenizer whose
    id of every byte is the byte's value, as hpctrain's byte data counts them. Returns its file's name."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = data.get("path")
    source = None
    if data.get("name") == "tokens" and path:
        from hpctrain.data.tokenfile import tokenizer_path

        source = tokenizer_path(path)
    if source is not None and source.is_file():
        tokenizer = Tokenizer.from_file(str(source))
    else:
        vocab = {char: b for b, char in byte_to_unicode().items()}
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(str(folder))
    return EXPORT_TOKENIZER
