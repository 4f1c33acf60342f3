"""``hpctrain prepare`` as typed, with its worker processes: two workers write the same file as one, a stopped
prepare (Ctrl-C, SIGTERM, a worker killed) leaves nothing and no worker behind; ``data=tokens`` trains on
the file, and export and generate carry its tokenizer. (The in-process checks: tests/unit/data/.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data import tokenfile
from hpctrain.data.prepare import _encoded
from hpctrain.data.tokenizer import tokenizer_for
from tests.support import CLI, REPO, STDLIB, hpctrain, metrics

TEXT = "def f(x):\n\treturn x  # ünïcödé, 日本語, emoji 🚀\r\n\n  spaces   and\ttabs\n"


def test_a_given_tokenizer_file_and_two_workers_give_the_same_file(
    bpe_corpus: Path, bpe_sources: Path
) -> None:
    out = bpe_corpus.parent.parent / "again" / "corpus.bin"
    given = str(bpe_corpus.with_suffix(".tokenizer.json"))
    result = hpctrain("prepare", str(bpe_sources), "--out", str(out), "--tokenizer", given, "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == bpe_corpus.read_bytes()
    assert tokenizer_for(out).encode(TEXT) == tokenizer_for(bpe_corpus).encode(TEXT)


def test_data_tokens_trains_on_it(cli: CLI, bpe_corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = hpctrain(
        "data=tokens",
        f"data.path={bpe_corpus}",
        "model.vocab_size=512",
        "model.seq_len=32",
        "trainer.max_steps=3",
        "trainer.eval_batches=1",
        "cluster.nproc=1",
        "parallel=none",
        "logger=jsonl",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(m.get("step", 0) for m in metrics(run)) == 3
    # The tokenizer travels: an export carries a copy, and generate speaks the run's BPE from either (export
    # and generate in this process: the command lines are tests/e2e/weights/test_export.py's).
    exported = cli("export", str(run), "--to", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "export" / "tokenizer.json").read_bytes() == tokenfile.tokenizer_path(
        bpe_corpus
    ).read_bytes()
    args = ["--prompt", "def decode(self", "--max-new-tokens", "8", "--seed", "1"]
    from_run = cli("generate", str(run), *args)
    from_export = cli("generate", str(tmp_path / "export"), *args)
    assert from_run.returncode == 0, from_run.stderr
    assert from_run.stdout == from_export.stdout and from_run.stdout.startswith("def decode(self")


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir(exist_ok=True)
    (tmp_path / "in" / "a.txt").write_text("some text\n" * 20)
    return tmp_path / "in" / "a.txt"


def test_a_bad_input_through_the_real_command_has_no_traceback(tmp_path: Path) -> None:
    result = hpctrain(
        "prepare", str(_corpus(tmp_path)), "--out", str(tmp_path / "c.bin"), "--tokenizer", "train:x"
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("hpctrain: ") and len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_prepare_with_workers_leaves_nothing(bpe_corpus: Path, tmp_path: Path, sig: int) -> None:
    """Ctrl-C (to the whole process group) or SIGTERM while 2 workers encode: one line, no temporary file."""
    text = b"".join(p.read_bytes() for p in sorted(STDLIB.glob("*.py")))
    big = tmp_path / "big.txt"
    big.write_bytes(text * max(1, 8_000_000 // len(text)))  # seconds of BPE encoding
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "hpctrain",
        "prepare",
        str(big),
        "--out",
        str(out / "x.bin"),
        "--tokenizer",
        str(bpe_corpus.with_suffix(".tokenizer.json")),
        "--workers",
        "2",
    ]
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
def test_a_worker_killed_halfway_through_sending_its_ids_is_one_error_not_a_hang(bpe_corpus: Path) -> None:
    """Both workers are stopped (SIGTERM) while their ids are half-way down the pipe: the next batch is the
    one-line OSError and no worker is left. ProcessPoolExecutor, used before, waited forever here: its manager
    thread blocked on the half-received result, whose pipe the parent itself held open."""
    json_text = bpe_corpus.with_suffix(".tokenizer.json").read_text()
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


def test_tokenizing_workers_start_with_ctrl_c_blocked(bpe_corpus: Path) -> None:
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
    tok = str(bpe_corpus.with_suffix(".tokenizer.json"))
    result = subprocess.run([sys.executable, "-c", code, tok], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    masks = [int(line.split()[1], 16) for line in result.stdout.splitlines()]
    assert len(masks) == 2 and all(m & (1 << (signal.SIGINT - 1)) for m in masks), result.stdout
