"""``hpctrain generate SOURCE --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]``.

Samples text from a causal language model (token ids in, logits per position out: the built-in gpt, a
transformers LM). SOURCE is a run directory (its latest checkpoint, or ``--step``) or a folder written by
``hpctrain export``. The text is tokenized as the run's data was (bytes, or the token file's tokenizer), the
context cropped to the model's length; sampling draws from a generator seeded with ``--seed``, so the same
command prints the same text; ``--temperature 0`` takes the most likely token. Imports torch when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpctrain.cli.common import TRUST_HELP, Parser
from hpctrain.config.sanity import check_text
from hpctrain.errors import ConfigError, require_package


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpctrain generate", description=__doc__.split("\n\n")[1].strip())
    p.add_argument("source", metavar="SOURCE", help="a run directory or an export folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step", type=int, default=None, help="a run directory's checkpoint (default: the latest)"
    )
    p.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    return p


def _require_tokenizers(source: Path) -> None:
    """The prompt is tokenized as the run's data was: by a ``tokenizers`` tokenizer when an export holds one
    (tokenizer.json) or the run's token file has one beside it (``<name>.tokenizer.json``). That package
    missing is said with its pip line before the model is built (not as a tokenizer option nobody gave)."""
    from omegaconf import OmegaConf

    from hpctrain.data.codec import EXPORT_TOKENIZER
    from hpctrain.data.tokenfile import tokenizer_path
    from hpctrain.rundir import RunDir
    from hpctrain.weights.export import EXPORT_META

    if (source / EXPORT_META).is_file():
        needs = (source / EXPORT_TOKENIZER).is_file()
    else:
        try:  # the run's data as config.yaml records it (unreadable: the run's own checks say why, later)
            data = OmegaConf.to_container(OmegaConf.load(RunDir(source).config).data, resolve=True)
            # A token file's tokenizer lies beside it; asked of the path, not of the dataset's kind (the core
            # never compares an input kind: tests/unit/test_rules.py).
            path = data.get("path")  # type: ignore[union-attr]
            needs = bool(path) and tokenizer_path(path).is_file()
        except Exception:
            needs = False
    if needs:
        require_package("SOURCE", str(source), "tokenizers")


def run(name: str, argv: list[str]) -> int:
    args = _parser().parse_or_exit(argv)
    if isinstance(args, int):
        return args
    try:
        check_text("SOURCE", args.source)
        if not args.prompt:
            raise ConfigError("--prompt", "", "empty", valid="some text to continue")
        check_text("--prompt", args.prompt.replace("\n", " ").replace("\t", " "))
        if args.max_new_tokens < 1:
            raise ConfigError("--max-new-tokens", args.max_new_tokens, "must be ≥ 1")
        if not args.temperature >= 0:
            raise ConfigError("--temperature", args.temperature, "must be ≥ 0")
        if args.top_k < 0:
            raise ConfigError("--top-k", args.top_k, "must be ≥ 0")
        _require_tokenizers(Path(args.source))
        from hpctrain.weights.generate import generate

        text = generate(
            Path(args.source),
            args.prompt,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.seed,
            args.step,
            args.trust_code,
        )
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0
