"""``hpctrain prepare INPUT... --out PATH.bin``: write a token file for ``data=tokens``. No torch import.

A bad argument or input is one line on stderr starting ``hpctrain: `` (exit 2 for arguments argparse
refuses and for a package the inputs need that is not installed, 1 otherwise), and nothing is left
half-written.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from hpctrain.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser
from hpctrain.data.tokenfile import header_path, tokenizer_path
from hpctrain.errors import MissingPackage, require_package


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (valid: 1, 2, … processes)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is below 1 (valid: 1, 2, … processes)")
    return n


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hpctrain prepare",
        description="Tokenize text files, directories or saved `datasets` folders, or convert .npy token "
        "arrays, into an hpctrain token file (PATH.bin + PATH.json header, + PATH.tokenizer.json) for "
        "data=tokens data.path=PATH.bin. The corpus streams through in bounded memory.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files or directories (or .npy files)")
    p.add_argument("--out", required=True, metavar="PATH.bin", help="output token file; must end in .bin")
    p.add_argument(
        "--tokenizer",
        default="bytes",
        metavar="bytes|PATH|train:VOCAB",
        help="bytes (vocab 256, the default), a tokenizers JSON file, or train:VOCAB to train a byte-level "
        "BPE of at most VOCAB ids on the corpus; saved beside the token file as PATH.tokenizer.json",
    )
    p.add_argument("--workers", type=_workers, default=1, metavar="N", help="tokenizing processes (1)")
    p.add_argument(
        "--text-column", default="text", metavar="NAME", help="the text column of a saved dataset (text)"
    )
    p.add_argument("--from-npy", action="store_true", help="inputs are 1-D integer .npy token arrays")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="vocabulary size (default: the tokenizer's, or max id + 1 for npy)",
    )
    return p


class _Stop:
    """Ctrl-C and SIGTERM (scancel, kill) recorded, not raised: prepare asks after every batch and before
    its commit (:func:`hpctrain.data.prepare.prepare_tokens`), so a stop is never lost in a destructor."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def requested(self) -> bool:
        return self.signum is not None


def _require_packages(args: argparse.Namespace) -> None:
    """A missing optional package the command needs, named with its pip line before any input is read:
    ``tokenizers`` for a tokenizer other than bytes, ``datasets`` for a saved dataset folder."""
    from hpctrain.data.corpus import is_saved_dataset

    if args.from_npy:  # ids given: neither is used
        return
    if args.tokenizer != "bytes":
        require_package("--tokenizer", args.tokenizer, "tokenizers")
    for text in args.inputs:
        if is_saved_dataset(Path(text)):
            require_package("INPUT", text, "datasets")


def run(name: str, argv: list[str]) -> int:
    from hpctrain.data.prepare import prepare_tokens  # numpy: only when it runs

    args = _parser().parse_or_exit(argv, prefix="hpctrain: prepare")
    if isinstance(args, int):
        return args
    try:
        _require_packages(args)
    except MissingPackage as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out)
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        header = prepare_tokens(
            [Path(p) for p in args.inputs],
            out,
            args.from_npy,
            args.vocab_size,
            tokenizer=args.tokenizer,
            workers=args.workers,
            text_column=args.text_column,
            stop=stop.requested,
        )
    except ValueError as e:  # a bad input (a missing file, a bad --vocab-size): 2, as everywhere else
        print(f"hpctrain: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # the system failed (a full disk, a worker that died): not the input's fault
        print(f"hpctrain: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("hpctrain: prepare interrupted; nothing was written", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    tok = header["tokenizer"]
    saved = f", tokenizer {tokenizer_path(out)}" if tok and tok["kind"] == "tokenizers" else ""
    print(
        f"wrote {header['num_tokens']} tokens (vocab {header['vocab_size']}, {header['dtype']}, "
        f"{out.stat().st_size} bytes) to {out} (header {header_path(out)}{saved})"
    )
    return EXIT_OK
