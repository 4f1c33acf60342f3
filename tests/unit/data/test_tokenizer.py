"""Tokenizers (hpctrain.data.tokenizer) of ``hpctrain prepare --tokenizer bytes|PATH|train:VOCAB``, issue 16
(items 4, 5): a trained BPE and its header, ids that nanoGPT's reader takes as they are, text that
round-trips; the tokenizer is found again from the token file. (Prepare's worker processes and a run on the
file: tests/e2e/data/test_prepare.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hpctrain.cli import main
from hpctrain.data.tokenfile import read_token_file
from hpctrain.data.tokenizer import ByteTokenizer, tokenizer_for


def run_prepare(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


TEXT = "def f(x):\n\treturn x  # ünïcödé, 日本語, emoji 🚀\r\n\n  spaces   and\ttabs\n"


def test_train_512_writes_token_file_tokenizer_and_header(bpe_corpus: Path) -> None:
    assert sorted(p.name for p in bpe_corpus.parent.iterdir()) == [
        "corpus.bin",
        "corpus.json",
        "corpus.tokenizer.json",
    ]
    header = json.loads(bpe_corpus.with_suffix(".json").read_text())
    assert header["version"] == 2 and header["dtype"] == "uint16" and header["vocab_size"] <= 512
    entry = header["tokenizer"]
    assert entry["kind"] == "tokenizers" and entry["file"] == "corpus.tokenizer.json"
    assert entry["vocab_size"] == header["vocab_size"] == 512
    assert header["num_tokens"] * 2 == bpe_corpus.stat().st_size


def test_nanogpt_reads_the_ids_the_tokenizer_gives(bpe_corpus: Path, bpe_sources: Path) -> None:
    """nanoGPT: ``np.memmap(path, dtype=np.uint16, mode="r")``, no header needed."""
    tok = tokenizer_for(bpe_corpus)
    expected = [i for f in sorted(bpe_sources.iterdir()) for i in tok.encode(f.read_text(encoding="utf-8"))]
    ids = np.memmap(bpe_corpus, dtype=np.uint16, mode="r")
    assert ids.tolist() == expected
    assert len(expected) < sum(f.stat().st_size for f in bpe_sources.iterdir()) / 2  # BPE merged a lot
    mapped, _ = read_token_file(bpe_corpus)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable


def test_round_trip_bpe_and_bytes(bpe_corpus: Path, tmp_path: Path) -> None:
    bpe = tokenizer_for(bpe_corpus)
    assert bpe.decode(bpe.encode(TEXT)) == TEXT
    assert max(bpe.encode(TEXT)) < 512
    raw = ByteTokenizer()
    assert raw.decode(raw.encode(TEXT)) == TEXT and raw.encode("é") == [0xC3, 0xA9]
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    assert run_prepare("prepare", [str(tmp_path / "a.txt"), "--out", str(tmp_path / "b.bin")]) == 0
    byte_tok = tokenizer_for(tmp_path / "b.bin")
    assert isinstance(byte_tok, ByteTokenizer)
    assert byte_tok.decode(np.memmap(tmp_path / "b.bin", dtype=np.uint16).tolist()) == TEXT
