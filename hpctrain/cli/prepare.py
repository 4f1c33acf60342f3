"""``hpctrain prepare INPUT... --out PATH.bin``: write a token file for ``data=tokens``. No torch import."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.data.prepare import prepare_tokens
from hpctrain.data.tokenfile import header_path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hpctrain prepare",
        description="Tokenize text files (byte-level, vocab 256) or convert .npy token arrays into an "
        "hpctrain token file (PATH.bin + PATH.json) for data=tokens data.path=PATH.bin.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files or directories (or .npy files)")
    p.add_argument("--out", required=True, metavar="PATH.bin", help="output token file; must end in .bin")
    p.add_argument("--from-npy", action="store_true", help="inputs are 1-D integer .npy token arrays")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="vocabulary size (default: 256 for text, max id + 1 for npy)",
    )
    return p


def run(name: str, argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed usage or help already
        return int(e.code or 0)
    out = Path(args.out)
    try:
        header = prepare_tokens([Path(p) for p in args.inputs], out, args.from_npy, args.vocab_size)
    except (ValueError, OSError) as e:
        print(f"hpctrain prepare: error: {e}", file=sys.stderr)
        return 1
    nbytes = out.stat().st_size
    print(
        f"wrote {header['num_tokens']} tokens (vocab {header['vocab_size']}, {header['dtype']}, "
        f"{nbytes} bytes) to {out} (header {header_path(out)})"
    )
    return 0
