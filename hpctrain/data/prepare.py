"""Token files from text, saved datasets or .npy arrays (what ``hpctrain prepare`` runs).

Text (files, directories, ``datasets`` folders: :mod:`hpctrain.data.corpus`) is tokenized by ``--tokenizer``
(:mod:`hpctrain.data.tokenizer`): bytes, a tokenizers JSON file, or a byte-level BPE trained here on the
corpus. ``--from-npy`` concatenates pre-tokenized 1-D integer ``.npy`` arrays.

Everything streams: the corpus is read in pieces, tokenized in batches (by ``workers`` processes, in order)
and the ids appended to the .bin as they come (:class:`hpctrain.data.tokenfile.TokenWriter`), so memory
stays bounded whatever the corpus size. The tokenizer is saved as ``PATH.tokenizer.json`` and the header
``PATH.json`` comes last; a refused or interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.data import corpus
from hpctrain.data import tokenizer as tokenizers_
from hpctrain.data.tokenfile import TokenWriter, header_path, tokenizer_path
from hpctrain.errors import ConfigError

_worker_tok: Any = None  # this process's tokenizers.Tokenizer, or None for bytes
_SERIAL = "TOKENIZERS_PARALLELISM"  # "false": tokenizers encodes a batch on this thread only


def _init_worker(json_text: str | None) -> None:
    global _worker_tok
    _worker_tok = None
    if json_text is not None:
        import tokenizers

        os.environ[_SERIAL] = "false"  # one worker, one core: --workers says how many are used
        _worker_tok = tokenizers.Tokenizer.from_str(json_text)


def _encode(batch: list[bytes]) -> np.ndarray:
    """The ids of a batch of pieces, each piece encoded on its own, in order."""
    if _worker_tok is None:
        return np.frombuffer(b"".join(batch), dtype=np.uint8)
    texts = [p.decode("utf-8", errors="replace") for p in batch]
    encode = getattr(_worker_tok, "encode_batch_fast", _worker_tok.encode_batch)  # fast: no offsets
    ids = [np.asarray(e.ids, dtype=np.uint32) for e in encode(texts, add_special_tokens=False)]
    return np.concatenate(ids) if ids else np.zeros(0, np.uint32)


_DIED = "a tokenizing worker process died (killed, or out of memory?)"


def _worker(conn: Connection, json_text: str) -> None:
    """A tokenizing process: a batch in, its ids (uint32 bytes) or an error line out, until the parent
    closes the pipe. It starts with SIGINT and SIGTERM blocked (:func:`_start`); SIGINT stays blocked, so
    Ctrl-C to the process group reaches only the parent (no worker traceback), which ends the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # and ignored, should anything have unblocked it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one sent while starting ends it here
    _init_worker(json_text)
    try:
        while True:
            batch = conn.recv()
            try:
                conn.send((_encode(batch).tobytes(), None))  # uint32: a tokenizer's ids
            except Exception as e:  # the parent reports it in one line
                conn.send((None, f"{type(e).__name__}: {e}"))
    except (EOFError, OSError):  # the parent is done (or gone)
        pass


def _start(json_text: str, workers: int) -> tuple[list[BaseProcess], list[Connection]]:
    """``workers`` processes, each with its own pipe. SIGINT and SIGTERM are blocked while they start, so
    a signal never lands between a process starting and it being recorded here (it is taken when the
    mask is restored); the workers inherit the mask (see :func:`_worker`). spawn: a worker never inherits
    a tokenizers thread pool (training uses one) through fork."""
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    # A spawned process needs multiprocessing's resource tracker; start it before the mask, because
    # starting it ends with SIG_UNBLOCK of SIGINT and SIGTERM (not a restore: CPython's
    # multiprocessing/resource_tracker.py), which would start the workers without the mask.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for _ in range(workers):
            mine, theirs = ctx.Pipe()
            conns.append(mine)
            try:
                proc = ctx.Process(target=_worker, args=(theirs, json_text), daemon=True)
                proc.start()
                procs.append(proc)
            finally:
                theirs.close()  # the worker holds the only other end: its death is EOF here
    except BaseException:
        _end(procs, conns, kill=True)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return procs, conns


def _end(procs: list[BaseProcess], conns: list[Connection], *, kill: bool) -> None:
    """End the workers: closing the pipes ends idle ones; ``kill`` (an error or a stop) does not wait for
    a batch to finish."""
    for conn in conns:
        conn.close()
    for proc in procs:
        if kill:
            proc.kill()
        proc.join(None if kill else 10)
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def _encoded(batches: Iterator[list[bytes]], json_text: str | None, workers: int) -> Iterator[np.ndarray]:
    """``_encode`` of every batch in order; with ``workers`` > 1 worker ``i`` takes batches ``i``,
    ``i + workers``, … one at a time, so results come back in order and memory stays bounded.

    Not ProcessPoolExecutor: its shutdown waits forever when a worker is killed (SIGTERM to the process
    group) while sending a result, because its manager thread blocks on the half-received message whose
    pipe the parent itself still holds open (Python 3.11.7: 3 of 6 kill times in a 50 MB result hung).
    Here each worker has its own pipe and the parent holds no copy of the worker's end, so a worker that
    dies is an EOF."""
    if workers == 1 or json_text is None:  # bytes: nothing for a worker to do but copy
        serial = os.environ.get(_SERIAL)
        _init_worker(json_text)
        try:
            yield from map(_encode, batches)
        finally:
            _init_worker(None)
            if serial is None:
                os.environ.pop(_SERIAL, None)
            else:
                os.environ[_SERIAL] = serial
        return
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    done = False
    try:
        procs, conns = _start(json_text, workers)
        busy: deque[int] = deque()  # the workers with a batch, oldest batch first
        for i in range(workers):
            batch = next(batches, None)
            if batch is None:
                break
            _send(conns[i], batch)
            busy.append(i)
        while busy:
            i = busy.popleft()
            following = next(batches, None)  # read while the worker still encodes
            ids = _receive(conns[i])
            if following is not None:
                _send(conns[i], following)
                busy.append(i)
            yield ids
        done = True
    finally:
        _end(procs, conns, kill=not done)


def _send(conn: Connection, batch: list[bytes]) -> None:
    try:
        conn.send(batch)
    except OSError:  # a broken pipe: the worker is gone
        raise OSError(_DIED) from None


def _receive(conn: Connection) -> np.ndarray:
    try:
        ids, error = conn.recv()
    except (EOFError, OSError):  # the worker is gone, maybe halfway through sending
        raise OSError(_DIED) from None
    if error is not None:
        raise ValueError(f"tokenizing failed in a worker process: {error}")
    return np.frombuffer(ids, dtype=np.uint32)


def _check_outputs(out: Path, inputs: list[Path]) -> None:
    """The output (PATH.bin, its PATH.json header, PATH.tokenizer.json) is a place for files; it must not
    overwrite an input, nor land inside an input directory, where the next run would read it back as text."""
    if out.suffix != ".bin":
        raise ValueError(f"--out must end in .bin (its header goes next to it as .json), got {out}")
    written = [out, header_path(out), tokenizer_path(out)]
    for path in written:
        if path.is_dir():
            raise ConfigError("--out", str(out), f"{path} is a directory", valid="a path for a new .bin file")
    resolved = {w.resolve() for w in written}
    for path in inputs:
        r = path.resolve()
        if r in resolved or (path.is_dir() and any(w.is_relative_to(r) for w in resolved)):
            raise ValueError(
                f"--out={out} would overwrite or land inside the input {path} "
                "(valid: a path outside every input file and directory)"
            )


def _train(sources: list[corpus.Source], vocab: int, text_column: str) -> tokenizers_.HFTokenizer:
    tok, trainer = tokenizers_.new_bpe(vocab)
    texts = (p.decode("utf-8", errors="replace") for p in corpus.pieces(sources, text_column))
    tok.train_from_iterator(texts, trainer=trainer)
    return tokenizers_.HFTokenizer(tok, tok.to_str())


def _vocab(given: int | None, needed: int, what: str) -> int:
    if given is None:
        return needed
    if given < needed:
        raise ValueError(f"--vocab-size={given} is too small for {what} (needs {needed})")
    return given


def _from_npy(
    inputs: list[Path], out: Path, vocab_size: int | None, stop: Callable[[], bool] | None = None
) -> dict[str, Any]:
    arrays = corpus.npy_arrays(inputs)
    lo, hi = 0, -1
    for block in corpus.npy_blocks(arrays):
        _stopped(stop)
        if block.size:
            lo, hi = min(lo, int(block.min())), max(hi, int(block.max()))
    if lo < 0:
        raise ValueError(f"token ids must be non-negative; found {lo}")
    total = sum(a.size for a in arrays)
    if total < 2:
        raise ValueError(f"inputs hold {total} token(s); a training window needs at least 2")
    vocab = _vocab(vocab_size, hi + 1, f"the largest token id {hi}")
    with TokenWriter(out, vocab) as writer:
        for block in corpus.npy_blocks(arrays):
            _stopped(stop)
            writer.write(block)
        with _held():
            _stopped(stop)
            return writer.commit(None)


def prepare_tokens(
    inputs: list[Path],
    out: Path,
    from_npy: bool,
    vocab_size: int | None,
    tokenizer: str = "bytes",
    workers: int = 1,
    text_column: str = "text",
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Write the token file ``out`` (with its header, and its tokenizer unless ``bytes``); return the
    header. A bad input is a ValueError (or an OSError) with one line, raised before anything is written.

    ``stop()``: whether a stop signal came (its handler only records it). It is asked after every batch and
    once more, with SIGINT and SIGTERM held back, right before the commit, and a stop raises
    KeyboardInterrupt there, in this frame: never inside a destructor or a finaliser that a signal handler
    raising at an arbitrary bytecode could hit, where Python prints the exception and goes on (a lost Ctrl-C,
    the output written anyway). A stop held back during the commit arrives after it: the file is whole."""
    if workers < 1:
        raise ConfigError("--workers", workers, "must be at least 1", valid="1, 2, … processes")
    _check_outputs(out, inputs)
    spec = tokenizers_.parse_spec(tokenizer)
    if from_npy:
        if spec.kind != "bytes":
            raise ConfigError("--tokenizer", tokenizer, "does not apply to --from-npy (ids are given)")
        return _from_npy(inputs, out, vocab_size, stop)
    sources = corpus.text_sources(inputs)
    for source in sources:
        if source.kind == "dataset":
            corpus.open_dataset(source.path, text_column)  # its text column is checked before any work
    tok: tokenizers_.ByteTokenizer | tokenizers_.HFTokenizer
    if spec.kind == "bytes":
        tok = tokenizers_.ByteTokenizer()
    elif spec.kind == "file":
        assert spec.path is not None
        tok = tokenizers_.load_file(spec.path)
    else:
        assert spec.vocab is not None
        tok = _train(sources, spec.vocab, text_column)
    vocab = _vocab(vocab_size, tok.vocab_size, f"the tokenizer's {tok.vocab_size} ids")
    json_text = tok.json_text if isinstance(tok, tokenizers_.HFTokenizer) else None
    _stopped(stop)
    with TokenWriter(out, vocab) as writer:
        parts = corpus.pieces(sources, text_column, cut=json_text is not None)
        try:
            for ids in _encoded(corpus.batches(parts), json_text, workers):
                _stopped(stop)
                writer.write(ids)
        except OSError:
            _stopped(stop)  # a stop to the process group ended the workers too: a stop, not a failure
            raise
        if writer.num_tokens < 2:
            raise ValueError(f"inputs hold {writer.num_tokens} token(s); a training window needs at least 2")
        files = {} if json_text is None else {tokenizer_path(out): json_text.encode()}
        with _held():
            _stopped(stop)  # the last word: from here the commit runs whole
            return writer.commit(tokenizers_.header_entry(tok, tokenizer_path(out).name), files)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered when it ends): a commit is not cut in two."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stopped(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise KeyboardInterrupt
