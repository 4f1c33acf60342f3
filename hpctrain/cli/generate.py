"""``hpctrain generate SOURCE --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]``.

Samples text from a causal language model (token ids in, logits per position out: the built-in gpt, a
transformers LM). SOURCE is a run directory (its latest checkpoint, or ``--step``) or a folder written by
``hpctrain export``. The text is tokenized as the run's data was (bytes, or the token file's tokenizer), the
context cropped to the model's length; sampling draws from a generator seeded with ``--seed``, so the same
command prints the same text; ``--temperature 0`` takes the most likely token. Imports torch when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpctrain.config.sanity import check_text
from hpctrain.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpctrain generate", description=__doc__.split("\n\n")[1].strip())
    p.add_argument("source", metavar="SOURCE", help="a run directory or an export folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step", type=int, default=None, help="a run directory's checkpoint (default: the latest)"
    )
    return p


def run(name: str, argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
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
        text = generate(Path(args.source), args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                        args.seed, args.step)  # fmt: skip
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


def load_model(source: Path, step: int | None) -> tuple[Any, Any, dict[str, Any]]:
    """(model with its weights, its ModelConfig, the run's data facts) of a run directory or an export."""
    from hpctrain.checkpoint.io import load_into
    from hpctrain.cli.export import EXPORT_META, checkpoint_of
    from hpctrain.config.io import load_run_config
    from hpctrain.config.schema import ModelConfig
    from hpctrain.models import build_model
    from hpctrain.rundir import RunDir

    if (source / EXPORT_META).is_file():
        meta = json.loads((source / EXPORT_META).read_text())
        if meta.get("format") != "hpctrain-export" or meta.get("version") != 1:
            raise ConfigError("SOURCE", str(source), f"{EXPORT_META} is not an hpctrain export of version 1")
        args = dict(meta["model"])
        model_cfg = ModelConfig(target=args.pop("_target_"), args=args)
        data = meta.get("data") or {}
        weights: Path = source
    else:
        weights = checkpoint_of(source, step, "SOURCE")
        cfg = load_run_config(RunDir(source).config)
        model_cfg = cfg.model
        data = {"name": cfg.data.name, "path": getattr(cfg.data, "path", None)}
    model = build_model(model_cfg)
    load_into(model, weights, strict=True, key="SOURCE")
    return model.eval(), model_cfg, data


def generate(
    source: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int,
    step: int | None = None,
) -> str:  # fmt: skip
    import torch

    from hpctrain.cli.export import EXPORT_META
    from hpctrain.data.codec import tokenizer_for_data
    from hpctrain.train.loss import logits_of

    if not source.exists():
        raise ConfigError("SOURCE", str(source), "no such file or directory")
    model, model_cfg, data = load_model(source, step)
    tokenizer = tokenizer_for_data(data, source if (source / EXPORT_META).is_file() else None)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ConfigError("--prompt", prompt, "gives no tokens")
    context = _context_length(model, model_cfg)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            try:
                logits = logits_of(model(tokens[:, -context:]))
            except Exception as err:
                raise ConfigError(
                    "SOURCE", model_cfg.target, f"is not a causal language model: {err}"
                ) from None
            if logits.dim() != 3:
                raise ConfigError(
                    "SOURCE", model_cfg.target, "is not a causal language model (no logits per position)"
                )
            last = logits[0, -1].float()
            if temperature == 0:
                token = int(last.argmax())
            else:
                last = last / temperature
                if top_k:
                    floor = torch.topk(last, min(top_k, last.numel())).values[-1]
                    last = last.masked_fill(last < floor, float("-inf"))
                token = int(torch.multinomial(torch.softmax(last, -1), 1, generator=generator))
            tokens = torch.cat([tokens, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(tokens[0].tolist())


def _context_length(model: Any, model_cfg: Any) -> int:
    """How many positions the model takes: its spec's tokens per sample, else a transformers config's."""
    from hpctrain.models.spec import model_spec

    spec = model_spec(model_cfg)
    if spec.tokens_per_sample > 1:
        return int(spec.tokens_per_sample)
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return 1024
