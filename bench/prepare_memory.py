"""Peak memory and throughput of ``hpctrain prepare`` on a corpus far larger than its memory budget.

    python bench/prepare_memory.py [--mb 200] [--train]

Writes a ~``--mb`` MB text file to a temporary directory (the standard library's ``.py`` sources, repeated),
then runs ``hpctrain prepare`` on it as a subprocess with ``--tokenizer bytes`` and with a byte-level BPE
(vocab 4096, trained beforehand on a 4 MB sample and given as a file) with 1 and 2 ``--workers``;
``--train`` adds ``--tokenizer train:4096`` on the whole file (training, then encoding). For each run it
prints the peak RSS (the largest single process, from ``wait4``, and the whole process tree, sampled every
20 ms) and the throughput in MB/s of input, against references timed in the same run on the same
(cached) file: ``cat FILE > /dev/null``, ``wc -w FILE``, and the tokenizers library's own
``encode_batch`` of the same BPE over the same text (64 KiB pieces cut at line starts, as prepare reads
them, 64 pieces a call) on as many threads as prepare has workers (``RAYON_NUM_THREADS``). Targets: peak RSS
under 300 MB; each BPE run at ≥ 0.5 × tokenizers' own on the same threads (the ``vs tok`` column).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000


def make_corpus(path: Path, size: int) -> int:
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    written, copy = 0, 0
    with open(path, "wb") as f:
        while written < size:
            block = text.replace(b"def ", f"def v{copy}_".encode())  # not quite the same text every time
            f.write(block)
            written += len(block)
            copy += 1
    return written


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (from /proc; 0 once gone)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += next(
                int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS")
            )
            for task in Path(f"/proc/{p}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total


def measure(cmd: list[str]) -> tuple[float, int, int]:
    """(seconds, peak RSS of the largest process, peak RSS of the process tree) of ``cmd``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_tree = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak_tree[0] = max(peak_tree[0], _tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
        )
    return seconds, usage.ru_maxrss * 1024, peak_tree[0]


# tokenizers' own encode_batch over the corpus, in 64 KiB pieces cut at line starts (as prepare cuts them).
TOKENIZERS_REFERENCE = """
import sys, tokenizers
tok = tokenizers.Tokenizer.from_file(sys.argv[1])
pieces, rest = [], b""
with open(sys.argv[2], "rb") as f:
    while block := f.read(1 << 16):
        block = rest + block
        cut = block.rfind(b"\\n") + 1 or len(block)
        pieces.append(block[:cut].decode("utf-8", errors="replace"))
        rest = block[cut:]
        if len(pieces) == 64:
            tok.encode_batch_fast(pieces, add_special_tokens=False)
            pieces = []
pieces.append(rest.decode("utf-8", errors="replace"))
tok.encode_batch_fast(pieces, add_special_tokens=False)
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=200, help="corpus size in MB (200)")
    parser.add_argument("--train", action="store_true", help="also train:4096 on the whole corpus")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (1 2)")
    opts = parser.parse_args()
    prepare = [sys.executable, "-m", "hpctrain", "prepare"]
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        corpus = tmp / "corpus.txt"
        size = make_corpus(corpus, opts.mb * MB)
        with open(corpus, "rb") as f, open(tmp / "sample.txt", "wb") as g:
            g.write(f.read(4 * MB))
        subprocess.run(
            [*prepare, str(tmp / "sample.txt"), "--out", str(tmp / "bpe.bin"), "--tokenizer", "train:4096"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
            capture_output=True,
        )
        bpe = str(tmp / "bpe.tokenizer.json")
        runs: dict[str, list[str]] = {
            "cat (reference)": ["sh", "-c", f"cat {corpus} > /dev/null"],
            "wc -w (reference)": ["wc", "-w", str(corpus)],
        }
        out = ["--out", str(tmp / "out.bin")]
        runs["prepare bytes"] = [*prepare, str(corpus), *out]  # bytes: no workers (nothing to tokenize)
        for workers in opts.workers:
            runs[f"tokenizers encode_batch, {workers} thr"] = [
                "env",
                "TOKENIZERS_PARALLELISM=true",
                f"RAYON_NUM_THREADS={workers}",
                sys.executable,
                "-c",
                TOKENIZERS_REFERENCE,
                bpe,
                str(corpus),
            ]
            runs[f"prepare bpe file, {workers} worker(s)"] = [
                *prepare,
                str(corpus),
                *out,
                "--tokenizer",
                bpe,
                "--workers",
                str(workers),
            ]
        if opts.train:
            runs["prepare train:4096, 2 worker(s)"] = [
                *prepare,
                str(corpus),
                "--out",
                str(tmp / "out.bin"),
                "--tokenizer",
                "train:4096",
                "--workers",
                "2",
            ]
        measure(runs["cat (reference)"])  # warm the page cache for every run alike
        print(f"corpus: {size / MB:.0f} MB of text; {os.cpu_count()} CPU cores\n")
        print(
            f"{'run':34} {'seconds':>8} {'MB/s':>8} {'vs cat':>8} {'vs wc':>8} {'vs tok':>8} {'peak MB':>8} "
            f"{'tree MB':>8}"
        )
        rate: dict[str, float] = {}
        for name, cmd in runs.items():
            seconds, peak, tree = measure(cmd)
            rate[name] = size / MB / seconds
            cat, wc = rate.get("cat (reference)", rate[name]), rate.get("wc -w (reference)", rate[name])
            threads = name.split(", ")[-1].split()[0] if name.startswith("prepare bpe") else None
            tok = rate.get(f"tokenizers encode_batch, {threads} thr") if threads else None
            versus = f"{rate[name] / tok:8.3f}" if tok else f"{'':8}"
            print(
                f"{name:34} {seconds:8.2f} {rate[name]:8.1f} {rate[name] / cat:8.3f} {rate[name] / wc:8.3f} "
                f"{versus} {peak / MB:8.0f} {tree / MB:8.0f}"
            )


if __name__ == "__main__":
    main()
