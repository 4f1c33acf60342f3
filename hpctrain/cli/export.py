"""``hpctrain export RUN_DIR [--step N] --to DIR [--format safetensors|hf|pt] [--dtype bf16|fp32]``.

Consolidates a checkpoint saved under any layout into one model in ``DIR``: safetensors (shards of at most
``--max-shard-gb`` with transformers' index when larger), a transformers folder that ``from_pretrained``
loads (config included; transformers models only), or a torch state dict. Beside the weights,
``hpctrain.json`` records the model's ``_target_`` and arguments, so ``model.init_from``, ``hpctrain
generate`` and people find what the weights belong to. A run that trained adapters (``model.adapters``)
exports them ``--merge``d into the base weights, or ``--adapters-only`` as a PEFT adapter folder. The
folder appears whole or not at all (written beside it, then renamed). Imports torch when it runs (not on
the submit path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.cli.common import TRUST_HELP, Parser
from hpctrain.config.sanity import check_text
from hpctrain.errors import ConfigError, require_package
from hpctrain.weights.export import DTYPES, FORMATS


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpctrain export", description=__doc__.split("\n\n")[1].strip())
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    p.add_argument(
        "--to", required=True, metavar="DIR", help="the folder to write (must not exist, or be empty)"
    )
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
    p.add_argument("--format", default="safetensors", help="safetensors (default), hf or pt")
    p.add_argument("--dtype", default="fp32", help="fp32 (default), bf16 or fp16")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors file (default 5)")
    p.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--merge", action="store_true", help="adapters folded into the base weights")
    which.add_argument("--adapters-only", action="store_true", help="the adapters alone, as a PEFT folder")
    return p


def run(name: str, argv: list[str]) -> int:
    args = _parser().parse_or_exit(argv)
    if isinstance(args, int):
        return args
    try:
        for key in ("run_dir", "to", "format", "dtype"):
            check_text(f"--{key.replace('_', '-')}", str(getattr(args, key)))
        if args.format not in FORMATS:
            raise ConfigError("--format", args.format, "not a known format", valid=", ".join(FORMATS))
        if args.dtype not in DTYPES:
            raise ConfigError("--dtype", args.dtype, "not a known dtype", valid=", ".join(DTYPES))
        if not args.max_shard_gb > 0:
            raise ConfigError("--max-shard-gb", args.max_shard_gb, "must be > 0")
        if args.format == "hf":  # save_pretrained writes the model, and its tokenizer beside it
            for package in ("transformers", "tokenizers"):
                require_package("--format", args.format, package)
        from hpctrain.weights.export import export

        written = export(
            Path(args.run_dir),
            Path(args.to),
            args.step,
            args.format,
            args.dtype,
            args.max_shard_gb,
            args.trust_code,
            "merge" if args.merge else "only" if args.adapters_only else "none",
        )
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return 2
    print(
        f"Exported {written['source']} (step {written['step']}, {written['parameters']:,} parameters, "
        f"{args.format}, {args.dtype}) to {args.to}"
    )
    return 0
