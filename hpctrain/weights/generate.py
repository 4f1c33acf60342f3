"""Text from saved weights: a causal language model (token ids in, logits per position out: the built-in
gpt, a transformers LM) loaded from a run directory or an export, prompted with the run's tokenizer, sampled
with a seeded generator (the same seed gives the same text; temperature 0 takes the most likely token)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpctrain.errors import ConfigError


def read_export(source: Path) -> tuple[Any, dict[str, Any]]:
    """(ModelConfig, data facts) of an export's hpctrain.json, or a one-line ConfigError when it is
    garbled, of another format or version, or lacks the model."""
    from hpctrain.config.schema import ModelConfig
    from hpctrain.errors import first_line
    from hpctrain.weights.export import EXPORT_FORMAT, EXPORT_META, EXPORT_VERSION

    path = source / EXPORT_META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError("SOURCE", str(source), f"{EXPORT_META} cannot be read: {first_line(err)}") from None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != EXPORT_FORMAT
        or meta.get("version") != EXPORT_VERSION
    ):
        raise ConfigError("SOURCE", str(source), f"{EXPORT_META} is not an hpctrain export of version 1")
    model, data = meta.get("model"), meta.get("data") or {}
    if (
        not isinstance(model, dict)
        or not isinstance(model.get("_target_"), str)
        or not isinstance(data, dict)
    ):
        raise ConfigError(
            "SOURCE",
            str(source),
            f"{EXPORT_META} is incomplete: no model _target_",
            valid="a folder written by hpctrain export",
        )
    args = dict(model)
    return ModelConfig(target=args.pop("_target_"), args=args), data


def load_model(source: Path, step: int | None, trust_code: bool = False) -> tuple[Any, Any, dict[str, Any]]:
    """(model with its weights, its ModelConfig, the run's data facts) of a run directory or an export.
    Only model classes are built from what the folder names, unless ``trust_code``
    (:mod:`hpctrain.weights.trust`)."""
    from hpctrain.models import build_model
    from hpctrain.models.adapters import adapter_names
    from hpctrain.weights.export import EXPORT_META, adapters_folded, checkpoint_of, run_config
    from hpctrain.weights.load import fill, load_into, read_checkpoint_model
    from hpctrain.weights.trust import check_trusted

    if (source / EXPORT_META).is_file():
        model_cfg, data = read_export(source)
        weights: Path = source
        named_in = str(source / EXPORT_META)
    else:
        weights = checkpoint_of(source, step, "SOURCE")
        cfg = run_config(source, "SOURCE")
        model_cfg = cfg.model
        data = {"name": cfg.data.name, "path": getattr(cfg.data, "path", None)}
        named_in = f"{source}/config.yaml"
    if not trust_code:
        check_trusted(model_cfg.target, model_cfg.args, named_in)
    model = build_model(model_cfg)
    if model_cfg.adapters != "none" and not (source / EXPORT_META).is_file():
        # A run that trained adapters: its checkpoint holds the adapters (and perhaps not the frozen base
        # weights, which model.init_from holds), folded in here as `hpctrain export --merge` folds them.
        tensors = read_checkpoint_model(weights, "SOURCE")
        found = adapter_names(list(tensors))
        if not found:
            raise ConfigError("SOURCE", str(source), f"the checkpoint {weights.name} holds no adapters")
        fill(model, adapters_folded(tensors, found, cfg, model), str(weights), strict=True, key="SOURCE")
    else:
        load_into(model, weights, strict=True, key="SOURCE")
    return model.eval(), model_cfg, data


def generate(
    source: Path,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
    step: int | None = None,
    trust_code: bool = False,
) -> str:
    import torch

    from hpctrain.data.codec import tokenizer_for_data
    from hpctrain.models.outputs import logits_of
    from hpctrain.weights.export import EXPORT_META

    if not source.exists():
        raise ConfigError("SOURCE", str(source), "no such file or directory")
    model, model_cfg, data = load_model(source, step, trust_code)
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
    from hpctrain.models.builtin import model_spec

    spec = model_spec(model_cfg)
    if spec.tokens_per_sample > 1:
        return int(spec.tokens_per_sample)
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    return 1024
