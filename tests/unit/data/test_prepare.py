"""``hpctrain prepare`` (hpctrain.data.prepare, hpctrain.cli.prepare) in this process: text and .npy inputs to
a token file that data=tokens reads; bad input is one line on stderr and leaves nothing half-written, nor
does an interrupted run; the output never overwrites an input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpctrain.cli import main
from hpctrain.config.schema import DataConfig
from hpctrain.data import build_datasets, corpus
from hpctrain.data.prepare import prepare_tokens
from hpctrain.data.tokenfile import read_header, read_token_file
from hpctrain.models.builtin import GPTSpec as GPTConfig


def run_prepare(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def prepare_main(argv: list[str]) -> int:
    return run_prepare("prepare", argv)


def test_prepare_text_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "b.txt").write_bytes(b"world")
    (src / "a.txt").write_bytes(b"hello ")
    (src / "sub" / "c.txt").write_bytes("é!".encode())
    (src / ".hidden").write_bytes(b"SKIPPED")
    out = tmp_path / "out" / "corpus.bin"
    assert prepare_main([str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "14 tokens" in printed and "vocab 256" in printed and str(out) in printed
    tokens, header = read_token_file(out)
    assert bytes(np.asarray(tokens, dtype=np.uint8)) == "hello worldé!".encode()
    assert header["vocab_size"] == 256 and header["dtype"] == "uint16"
    # The file feeds data=tokens directly.
    data = DataConfig(name="tokens", path=str(out), val_fraction=0.3)
    train, val = build_datasets(data, GPTConfig(seq_len=2), seed=0)
    assert len(train) + len(val) == (14 - 1) // 2
    x, y = train.get_batch([0])
    assert x.tolist() == [[ord("h"), ord("e")]] and y.tolist() == [[ord("e"), ord("l")]]


def test_prepare_npy_cli_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arr = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int32)
    np.save(tmp_path / "a.npy", arr)
    out = tmp_path / "a.bin"
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy"]) == 0
    tokens, header = read_token_file(out)
    assert tokens.tolist() == arr.tolist() and header["vocab_size"] == 10
    assert (
        prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy", "--vocab-size", "70000"]) == 0
    )
    assert read_header(out)["dtype"] == "uint32"
    capsys.readouterr()
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(out), "--from-npy", "--vocab-size", "5"]) == 2
    assert "--vocab-size=5 is too small for the largest token id 9" in capsys.readouterr().err
    assert prepare_main([str(tmp_path / "a.npy"), "--out", str(tmp_path / "a.dat"), "--from-npy"]) == 2
    assert "must end in .bin" in capsys.readouterr().err
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype=np.int64))
    assert prepare_main([str(tmp_path / "m.npy"), "--out", str(out), "--from-npy"]) == 2
    assert "expected a 1-D integer array" in capsys.readouterr().err
    assert prepare_main([str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert prepare_main([]) == 2  # argparse usage error
    # A vocabulary larger than the model's is caught when building datasets.
    with pytest.raises(ValueError, match=r"model\.vocab_size=8: data=tokens has a vocabulary of 70000"):
        build_datasets(DataConfig(name="tokens", path=str(tmp_path / "a.bin")), GPTConfig(vocab_size=8), 0)


@pytest.mark.parametrize("case", ["same file", "its header", "inside the input directory"])
def test_prepare_refuses_to_write_over_its_input(cli, tmp_path: Path, case: str):  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello world\n")
    made = cli("prepare", str(src / "a.txt"), "--out", str(tmp_path / "a.bin"))
    assert made.returncode == 0, made.stderr
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    inputs, out = {
        "same file": (tmp_path / "a.bin", tmp_path / "a.bin"),
        "its header": (tmp_path / "a.json", tmp_path / "a.bin"),
        "inside the input directory": (src, src / "corpus.bin"),
    }[case]
    result = cli("prepare", str(inputs), "--out", str(out))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--out={out}" in lines[0] and "valid:" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_interrupted_prepare_leaves_the_earlier_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("hello world\n" * 100)
    out = tmp_path / "out" / "a.bin"
    assert prepare_main([str(tmp_path / "a.txt"), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}

    def broken(parts, batch_bytes=0):  # type: ignore[no-untyped-def]
        yield [next(parts)]
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus, "batches", broken)
    with pytest.raises(KeyboardInterrupt):
        prepare_tokens([tmp_path / "a.txt"], out, False, None, tokenizer="train:300")
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "a.txt").write_text("some text\n" * 20)
    return tmp_path / "in" / "a.txt"


BAD = {
    "empty tokenizer": (["--tokenizer", ""], ["--tokenizer=", "is empty", "valid: bytes"]),
    "train:0": (["--tokenizer", "train:0"], ["--tokenizer=train:0", "out of range", "256 ≤ VOCAB"]),
    "train:abc": (["--tokenizer", "train:abc"], ["--tokenizer=train:abc", "not an integer"]),
    "train:99999999": (["--tokenizer", "train:99999999"], ["train:99999999", "out of range"]),
    "missing tokenizer file": (["--tokenizer", "TMP/nope.json"], ["nope.json", "no such file"]),
    "not a tokenizer": (["--tokenizer", "TMP/in/a.txt"], ["a.txt", "not a tokenizers JSON file"]),
    "control character": (["--tokenizer", "train:5\x1b[2J"], ["\\x1b[2J", "control character"]),
    "workers 0": (["--workers", "0"], ["--workers", "valid: 1, 2"]),
    "out is a directory": (["--out", "TMP/dir.bin"], ["--out=", "dir.bin is a directory"]),
    "missing corpus": (["TMP/missing.txt"], ["missing.txt does not exist"]),
    "empty corpus": (["TMP/empty.txt"], ["the corpus is empty"]),
    "empty directory": (["TMP/emptydir"], ["emptydir contains no files"]),
    "one token": (["TMP/one.txt"], ["inputs hold 1 token(s)"]),  # found while writing: its out/ goes too
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_are_one_line_and_leave_nothing(tmp_path: Path, case: str, capsys) -> None:  # type: ignore[no-untyped-def]
    extra, words = BAD[case]
    (tmp_path / "dir.bin").mkdir()
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "one.txt").write_bytes(b"x")
    argv = [str(_corpus(tmp_path)), "--out", str(tmp_path / "out" / "c.bin")]
    extra = [a.replace("TMP", str(tmp_path)) for a in extra]
    if extra[0] in ("--out", "--tokenizer", "--workers"):
        argv += extra
    else:
        argv = extra + argv[1:]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert prepare_main(argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
