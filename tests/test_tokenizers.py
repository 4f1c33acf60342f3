"""Issue 16 (items 4, 5): ``hpctrain prepare --tokenizer bytes|PATH|train:VOCAB`` writes a token file that
nanoGPT's reader takes as is, that ``data=tokens`` trains on, and whose tokenizer is found again from it;
bad input is one line on stderr and leaves nothing half-written."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, hpctrain, metrics

from hpctrain.cli import main as hpctrain_main
from hpctrain.data import corpus, tokenfile
from hpctrain.data.catalog import read_token_header
from hpctrain.data.prepare import _encoded, prepare_tokens
from hpctrain.data.tokenfile import read_token_file, write_token_file
from hpctrain.data.tokenizer import ByteTokenizer, tokenizer_for


def run_prepare(name: str, argv: list[str]) -> int:
    """``hpctrain prepare ARGV`` in this process, through the CLI's entry point."""
    return hpctrain_main([name, *argv])


STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT = "def f(x):\n\treturn x  # ünïcödé, 日本語, emoji 🚀\r\n\n  spaces   and\ttabs\n"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 100 kB of the standard library's sources, copied (so the test owns the input directory)."""
    src = tmp_path_factory.mktemp("corpus") / "src"
    src.mkdir()
    for name in ("json/decoder.py", "json/encoder.py", "json/scanner.py", "textwrap.py", "shlex.py"):
        shutil.copy(STDLIB / name, src / name.replace("/", "_"))
    return src


@pytest.fixture(scope="module")
def trained(sources: Path) -> Path:
    out = sources.parent / "out" / "corpus.bin"
    result = hpctrain("prepare", str(sources), "--out", str(out), "--tokenizer", "train:512", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "tokenizer" in result.stdout and str(out) in result.stdout
    return out


def test_train_512_writes_token_file_tokenizer_and_header(trained: Path) -> None:
    assert sorted(p.name for p in trained.parent.iterdir()) == [
        "corpus.bin",
        "corpus.json",
        "corpus.tokenizer.json",
    ]
    header = json.loads(trained.with_suffix(".json").read_text())
    assert header["version"] == 2 and header["dtype"] == "uint16" and header["vocab_size"] <= 512
    entry = header["tokenizer"]
    assert entry["kind"] == "tokenizers" and entry["file"] == "corpus.tokenizer.json"
    assert entry["vocab_size"] == header["vocab_size"] == 512
    assert header["num_tokens"] * 2 == trained.stat().st_size


def test_nanogpt_reads_the_ids_the_tokenizer_gives(trained: Path, sources: Path) -> None:
    """nanoGPT: ``np.memmap(path, dtype=np.uint16, mode="r")``, no header needed."""
    tok = tokenizer_for(trained)
    expected = [i for f in sorted(sources.iterdir()) for i in tok.encode(f.read_text(encoding="utf-8"))]
    ids = np.memmap(trained, dtype=np.uint16, mode="r")
    assert ids.tolist() == expected
    assert len(expected) < sum(f.stat().st_size for f in sources.iterdir()) / 2  # BPE merged a lot
    mapped, _ = read_token_file(trained)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable


def test_round_trip_bpe_and_bytes(trained: Path, tmp_path: Path) -> None:
    bpe = tokenizer_for(trained)
    assert bpe.decode(bpe.encode(TEXT)) == TEXT
    assert max(bpe.encode(TEXT)) < 512
    raw = ByteTokenizer()
    assert raw.decode(raw.encode(TEXT)) == TEXT and raw.encode("é") == [0xC3, 0xA9]
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    assert run_prepare("prepare", [str(tmp_path / "a.txt"), "--out", str(tmp_path / "b.bin")]) == 0
    byte_tok = tokenizer_for(tmp_path / "b.bin")
    assert isinstance(byte_tok, ByteTokenizer)
    assert byte_tok.decode(np.memmap(tmp_path / "b.bin", dtype=np.uint16).tolist()) == TEXT


def test_a_given_tokenizer_file_and_two_workers_give_the_same_file(trained: Path, sources: Path) -> None:
    out = trained.parent.parent / "again" / "corpus.bin"
    given = str(trained.with_suffix(".tokenizer.json"))
    result = hpctrain("prepare", str(sources), "--out", str(out), "--tokenizer", given, "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == trained.read_bytes()
    assert tokenizer_for(out).encode(TEXT) == tokenizer_for(trained).encode(TEXT)


def test_data_tokens_trains_on_it(trained: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = hpctrain(
        "data=tokens", f"data.path={trained}", "model.vocab_size=512", "model.seq_len=32",
        "trainer.max_steps=3", "trainer.eval_batches=1", "cluster.nproc=1", "parallel=none",
        "logger=jsonl", f"hydra.run.dir={run}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(m.get("step", 0) for m in metrics(run)) == 3
    # The tokenizer travels: an export carries a copy, and generate speaks the run's BPE from either.
    exported = hpctrain("export", str(run), "--to", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "export" / "tokenizer.json").read_bytes() == tokenfile.tokenizer_path(
        trained
    ).read_bytes()
    args = ["--prompt", "def decode(self", "--max-new-tokens", "8", "--seed", "1"]
    from_run = hpctrain("generate", str(run), *args)
    from_export = hpctrain("generate", str(tmp_path / "export"), *args)
    assert from_run.returncode == 0, from_run.stderr
    assert from_run.stdout == from_export.stdout and from_run.stdout.startswith("def decode(self")


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


def test_an_interrupted_prepare_leaves_the_earlier_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("hello world\n" * 100)
    out = tmp_path / "out" / "a.bin"
    assert run_prepare("prepare", [str(tmp_path / "a.txt"), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}

    def broken(parts, batch_bytes=0):  # type: ignore[no-untyped-def]
        yield [next(parts)]
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus, "batches", broken)
    with pytest.raises(KeyboardInterrupt):
        prepare_tokens([tmp_path / "a.txt"], out, False, None, tokenizer="train:300")
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before


def test_header_versions(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t.bin", np.arange(4), vocab_size=256)
    header = json.loads((tmp_path / "t.json").read_text())
    (tmp_path / "t.json").write_text(
        json.dumps({k: v for k, v in header.items() if k != "tokenizer"} | {"version": 1})
    )
    assert read_token_file(tmp_path / "t.bin")[0].tolist() == [0, 1, 2, 3]  # version 1 still reads
    assert isinstance(tokenizer_for(tmp_path / "t.bin"), ByteTokenizer)  # what version 1 wrote from text
    v1 = json.loads((tmp_path / "t.json").read_text())
    (tmp_path / "t.json").write_text(json.dumps(v1 | {"vocab_size": 1000}))
    with pytest.raises(ValueError, match=r"version 1\) records no tokenizer"):
        tokenizer_for(tmp_path / "t.bin")
    (tmp_path / "t.json").write_text(json.dumps(header | {"version": 7}))
    for read in (read_token_header, tokenizer_for):
        with pytest.raises(ValueError, match=r"has version 7; valid: 1 or 2") as err:
            read(tmp_path / "t.bin")
        assert "\n" not in str(err.value)


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
    assert run_prepare("prepare", argv) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_bad_input_through_the_real_command_has_no_traceback(tmp_path: Path) -> None:
    result = hpctrain(
        "prepare", str(_corpus(tmp_path)), "--out", str(tmp_path / "c.bin"), "--tokenizer", "train:x"
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("hpctrain: ") and len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_prepare_with_workers_leaves_nothing(trained: Path, tmp_path: Path, sig: int) -> None:
    """Ctrl-C (to the whole process group) or SIGTERM while 2 workers encode: one line, no temporary file."""
    text = b"".join(p.read_bytes() for p in sorted(STDLIB.glob("*.py")))
    big = tmp_path / "big.txt"
    big.write_bytes(text * max(1, 8_000_000 // len(text)))  # seconds of BPE encoding
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "hpctrain", "prepare", str(big), "--out", str(out / "x.bin"),
           "--tokenizer", str(trained.with_suffix(".tokenizer.json")), "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out.is_dir() and any(out.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the workers are encoding
        assert proc.poll() is None, "finished before it could be stopped"
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and err.strip().splitlines() == [
        "hpctrain: prepare interrupted; nothing was written"
    ], err
    assert not out.exists()


def _blocked_sending(pid: int) -> bool:
    """The process sleeps in a write to a full socket pair (multiprocessing's duplex Pipe) or pipe (Linux's
    wait channel: sock_alloc_send_pskb, anon_pipe_write or pipe_write)."""
    wchan = Path(f"/proc/{pid}/wchan").read_text()
    return wchan.startswith("sock_alloc_send") or "pipe_write" in wchan


@pytest.mark.timeout(120)
def test_a_worker_killed_halfway_through_sending_its_ids_is_one_error_not_a_hang(trained: Path) -> None:
    """Both workers are stopped (SIGTERM) while their ids are half-way down the pipe: the next batch is the
    one-line OSError and no worker is left. ProcessPoolExecutor, used before, waited forever here: its manager
    thread blocked on the half-received result, whose pipe the parent itself held open."""
    json_text = trained.with_suffix(".tokenizer.json").read_text()
    text = b"".join(p.read_bytes() for p in sorted(STDLIB.glob("*.py")))[: 3 << 20]
    pieces = [text[i : i + (1 << 16)] for i in range(0, len(text), 1 << 16)]
    batches = [pieces, pieces[::-1], pieces[1:], pieces[2:]]  # ids of MiBs each: far more than a pipe holds
    before = set(multiprocessing.active_children())
    encoded = _encoded(iter(batches), json_text, 2)
    first = next(encoded)
    workers = [p for p in multiprocessing.active_children() if p not in before]
    assert len(workers) == 2
    serial = list(_encoded(iter(batches[:1]), json_text, 1))
    assert np.array_equal(first, serial[0])  # the worker's ids are the in-process ones
    deadline = time.monotonic() + 90
    while not all(_blocked_sending(p.pid) for p in workers if p.pid is not None):
        assert time.monotonic() < deadline, "the workers never blocked sending their ids"
        time.sleep(0.05)
    for p in workers:
        assert p.pid is not None
        os.kill(p.pid, signal.SIGTERM)
    with pytest.raises(OSError, match=r"^a tokenizing worker process died \(killed, or out of memory\?\)$"):
        next(encoded)
    assert not any(p.is_alive() for p in workers)


def test_tokenizing_workers_start_with_ctrl_c_blocked(trained: Path) -> None:
    """Ctrl-C to the process group must reach only the parent: each worker starts with SIGINT blocked, in a
    fresh process (where starting multiprocessing's resource tracker would otherwise unblock it first)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from hpctrain.data.prepare import _end, _start\n"
        "procs, conns = _start(Path(sys.argv[1]).read_text(), 2)\n"
        "for p in procs:\n"
        "    status = Path(f'/proc/{p.pid}/status').read_text().splitlines()\n"
        "    print(next(line for line in status if line.startswith('SigBlk:')))\n"
        "_end(procs, conns, kill=False)\n"
    )
    tok = str(trained.with_suffix(".tokenizer.json"))
    result = subprocess.run([sys.executable, "-c", code, tok], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    masks = [int(line.split()[1], 16) for line in result.stdout.splitlines()]
    assert len(masks) == 2 and all(m & (1 << (signal.SIGINT - 1)) for m in masks), result.stdout
