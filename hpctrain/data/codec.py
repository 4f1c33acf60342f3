"""Text ↔ token ids for tools that read or write text (``hpctrain generate``): the run's own tokenizer.

The built-in text data and the example byte datasets are byte-level (ids 0-255 are UTF-8 bytes); a token
file names its tokenizer in its header when it was made with one.
"""

from __future__ import annotations

from typing import Any, Protocol


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; bytes that do not decode are shown as U+FFFD."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def tokenizer_for_data(data: dict[str, Any]) -> Tokenizer:
    """The tokenizer of a run's data (``{"name": ..., "path": ...}``): a token file's own when its header
    names one, else bytes."""
    path = data.get("path")
    if data.get("name") == "tokens" and path:
        from hpctrain.data import tokenfile

        found = getattr(tokenfile, "tokenizer_for", None)
        if found is not None:
            return found(path)
    return ByteTokenizer()
