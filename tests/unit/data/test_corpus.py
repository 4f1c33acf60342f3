"""Reading a corpus (hpctrain.data.corpus): pieces cut at line starts, never inside a character; a folder
saved by ``datasets`` is a source."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from hpctrain.cli import main
from hpctrain.data import corpus
from hpctrain.data.prepare import prepare_tokens
from hpctrain.data.tokenfile import read_token_file
from hpctrain.data.tokenizer import tokenizer_for


def run_prepare(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_streaming_cuts_pieces_at_newlines_and_characters(tmp_path: Path) -> None:
    """Small pieces of a multi-byte text join to the same file, and each piece decodes on its own."""
    text = ("aé日🚀\n" * 50 + "x" * 40 + "日本" * 30).encode()
    (tmp_path / "t.txt").write_bytes(text)
    parts = list(corpus.pieces(corpus.text_sources([tmp_path / "t.txt"]), "text", chunk_bytes=7))
    assert b"".join(parts) == text and len(parts) > 20
    for part in parts:
        part.decode("utf-8")  # never cut inside a character
    out = tmp_path / "o.bin"
    prepare_tokens([tmp_path / "t.txt"], out, False, None, tokenizer="bytes")
    assert bytes(np.memmap(out, dtype=np.uint16).astype(np.uint8)) == text


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets is not installed")
def test_a_saved_dataset_is_a_source(tmp_path: Path) -> None:
    import datasets

    rows = ["first row\n", "é second", None, "third"]
    datasets.Dataset.from_dict({"body": rows, "n": [1, 2, 3, 4]}).save_to_disk(str(tmp_path / "ds"))
    argv = [str(tmp_path / "ds"), "--out", str(tmp_path / "d.bin"), "--text-column", "body"]
    assert run_prepare("prepare", argv) == 0
    assert tokenizer_for(tmp_path / "d.bin").decode(read_token_file(tmp_path / "d.bin")[0].tolist()) == (
        "first row\né secondthird"
    )
