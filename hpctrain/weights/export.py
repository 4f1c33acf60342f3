"""Weights out: a checkpoint saved under any layout, consolidated into one model in a folder.

safetensors (shards of at most ``max_shard_gb`` with transformers' index when larger), a transformers folder
that ``from_pretrained`` loads (config included; transformers models only), or a torch state dict. Beside
the weights, ``hpctrain.json`` records the model's ``_target_`` and arguments and the run's tokenizer, so
``model.init_from``, ``hpctrain generate`` and people find what the weights belong to. The folder appears
whole or not at all (written beside it, then renamed). Reads the checkpoint through the safe reader
(:mod:`hpctrain.weights.load`): nothing but tensors is unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from hpctrain.errors import ConfigError

FORMATS = ("safetensors", "hf", "pt")
# A run with adapters (model.adapters): "merge" folds them into the base weights (a plain model of any
# format), "only" writes them alone as a PEFT adapter folder (adapter_model.safetensors, adapter_config.json).
ADAPTER_EXPORTS = ("none", "merge", "only")
PEFT_WEIGHTS, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"
DTYPES = ("fp32", "bf16", "fp16")
EXPORT_META = "hpctrain.json"
EXPORT_FORMAT, EXPORT_VERSION = "hpctrain-export", 1


def checkpoint_of(run_dir: Path, step: int | None, key: str = "RUN_DIR") -> Path:
    """The committed checkpoint of ``run_dir`` at ``step`` (default: the latest), or a one-line error."""
    from hpctrain.rundir import RunDir
    from hpctrain.rundir import checkpoints as layout

    if not RunDir(run_dir).config.is_file():
        raise ConfigError(key, str(run_dir), "not a run directory (no config.yaml)")
    committed = layout.committed(RunDir(run_dir).shared_checkpoints)
    if step is not None:
        chosen = [c for c in committed if layout.step_of(c) == step]
        if not chosen:
            have = ", ".join(str(layout.step_of(c)) for c in committed) or "none"
            raise ConfigError("--step", step, "no committed checkpoint of that step", valid=have)
        return chosen[0]
    if not committed:
        raise ConfigError(key, str(run_dir), "holds no committed checkpoint")
    return committed[0]


def run_config(run_dir: Path, key: str = "RUN_DIR") -> Any:
    """The typed config of a run directory's config.yaml, or a one-line ConfigError naming the run when
    it is garbled, from another version or holds keys this hpctrain does not know."""
    from hpctrain.config.io import load_run_config
    from hpctrain.errors import first_line
    from hpctrain.rundir import RunDir

    path = RunDir(run_dir).config
    try:
        return load_run_config(path)
    except ConfigError as err:
        raise ConfigError(key, str(run_dir), f"its config.yaml is not a valid run config: {err}") from None
    except Exception as err:  # YAML or OmegaConf's own errors: the file is damaged or not hpctrain's
        raise ConfigError(key, str(run_dir), f"its config.yaml cannot be read: {first_line(err)}") from None


def adapters_folded(weights: dict[str, Any], found: list[str], cfg: Any, model: Any) -> dict[str, Any]:
    """A trained run's checkpoint ``weights`` with its adapters (``found``) folded into the base weights:
    the plain model's tensors, as ``export --merge`` writes them and ``generate`` loads them."""
    from hpctrain.models.adapters import merged, transposed_modules
    from hpctrain.weights.load import match_names, read_weights, wanted_names

    if cfg.model.init_from is not None and not set(wanted_names(model)) <= set(weights):
        # The checkpoint holds what trained; the base weights are those the run started from.
        base = match_names(wanted_names(model), read_weights(Path(cfg.model.init_from), "model.init_from"))
        weights = {**base, **{n: weights[n] for n in found}}
    return merged(weights, cfg.model.lora, transposed_modules(model))


def check_destination(to: Path) -> None:
    """``--to`` must be a new or empty folder in a place this process can write."""
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise ConfigError("--to", str(to), "exists and is not an empty folder", valid="a new folder")
    parent = next((p for p in [to, *to.absolute().parents] if p.exists()), Path("/"))
    if not parent.is_dir():
        raise ConfigError(
            "--to", str(to), f"cannot be created: {parent} is not a folder", valid="a new folder"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            "--to", str(to), f"cannot be written: {parent} is not writable", valid="a new folder"
        )


def export(
    run_dir: Path,
    to: Path,
    step: int | None,
    fmt: str,
    dtype: str,
    max_shard_gb: float = 5.0,
    trust_code: bool = False,
    adapters: str = "none",
) -> dict[str, Any]:
    """``adapters``: none, merge (folded into the base weights) or only (a PEFT adapter folder)."""
    import torch

    from hpctrain.models import build_model
    from hpctrain.models.adapters import adapter_names, peft_config, transposed_modules
    from hpctrain.rundir import checkpoints as layout
    from hpctrain.weights.load import read_checkpoint_model, wanted_names
    from hpctrain.weights.trust import check_trusted

    check_destination(to)
    checkpoint = checkpoint_of(run_dir, step)
    cfg = run_config(run_dir)
    if not trust_code:
        check_trusted(cfg.model.target, cfg.model.args, f"{run_dir}/config.yaml", "RUN_DIR")
    trained_adapters = cfg.model.adapters != "none"
    if trained_adapters and adapters == "none":
        raise ConfigError(
            "RUN_DIR",
            str(run_dir),
            f"trained model.adapters={cfg.model.adapters}: export them folded into the base weights or alone",
            valid="--merge or --adapters-only",
        )
    if not trained_adapters and adapters != "none":
        flag = "--merge" if adapters == "merge" else "--adapters-only"
        raise ConfigError(flag, True, f"the run {run_dir} trained no adapters (model.adapters=none)")
    if adapters == "only" and fmt != "safetensors":
        raise ConfigError("--format", fmt, "an adapter folder is PEFT's safetensors", valid="safetensors")
    with torch.device("meta"):
        model = build_model(cfg.model)
    is_hf = hasattr(model, "save_pretrained") and hasattr(model, "config")
    if fmt == "hf" and not is_hf:
        raise ConfigError(
            "--format",
            "hf",
            f"model {cfg.model.target} is not a transformers model",
            valid="safetensors or pt",
        )
    weights = read_checkpoint_model(checkpoint, "RUN_DIR")
    if trained_adapters:
        found = adapter_names(list(weights))
        if not found:
            raise ConfigError("RUN_DIR", str(run_dir), f"the checkpoint {checkpoint.name} holds no adapters")
        if adapters == "only":
            fan_in_fan_out = bool(transposed_modules(model) & {n.rsplit(".", 2)[0] for n in found})
            return _export_adapters(
                {n: weights[n] for n in found},
                cfg,
                checkpoint,
                to,
                dtype,
                peft_config,
                is_hf,
                layout.step_of,
                fan_in_fan_out,
            )
        weights = adapters_folded(weights, found, cfg, model)
    names = wanted_names(model)
    missing = [n for n in names if n not in weights]
    if missing:
        raise ConfigError(
            "RUN_DIR",
            str(run_dir),
            f"the checkpoint lacks {len(missing)} of the model's tensors: " + ", ".join(missing[:3]),
        )
    own = model.state_dict()
    wrong = [
        f"{n} {tuple(weights[n].shape)} ≠ {tuple(own[n].shape)}"
        for n in names
        if weights[n].shape != own[n].shape
    ]
    if wrong:  # the metadata written beside the weights must describe them
        raise ConfigError(
            "RUN_DIR",
            str(run_dir),
            f"the checkpoint's tensors do not fit the model its config.yaml builds: {len(wrong)} of another "
            f"shape ({', '.join(wrong[:3])})",
        )
    cast = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    weights = {
        n: (t.to(cast) if t.is_floating_point() else t).contiguous() for n, t in weights.items() if n in names
    }
    partial = to.with_name(f".{to.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        if fmt == "hf":
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # one line of ours says what was written
            real = build_model(cfg.model)
            real.load_state_dict(weights, strict=False)  # tied aliases follow their first name
            real.to(cast).save_pretrained(str(partial), safe_serialization=True)
        elif fmt == "pt":
            torch.save(weights, partial / "model.pt")
        else:
            _save_safetensors(weights, partial, int(max_shard_gb * 2**30))
        from hpctrain.data.codec import copy_tokenizer, save_hf_tokenizer

        data = {"name": cfg.data.name, "path": getattr(cfg.data, "path", None)}
        # Beside the weights: generate and people find it there; an hf folder's, AutoTokenizer loads.
        tokenizer = save_hf_tokenizer(data, partial) if fmt == "hf" else copy_tokenizer(data, partial)
        _publish(partial, to, _meta(checkpoint, fmt, dtype, cfg, data=data, tokenizer=tokenizer))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {
        "source": checkpoint,
        "step": layout.step_of(checkpoint),
        "parameters": sum(t.numel() for t in weights.values()),
    }


def _export_adapters(
    weights: dict[str, Any],
    cfg: Any,
    checkpoint: Path,
    to: Path,
    dtype: str,
    peft_config: Any,
    is_hf: bool,
    step_of: Any,
    fan_in_fan_out: bool,
) -> dict[str, Any]:
    """The adapters alone as PEFT's folder (``PeftModel.from_pretrained(base, DIR)`` loads it onto the base
    model: PEFT's names are ``base_model.model.<module>.lora_A.weight``)."""
    import torch
    from safetensors.torch import save_file

    cast = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    targets = sorted({n.rsplit(".", 2)[0] for n in weights})
    partial = to.with_name(f".{to.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        tensors = {f"base_model.model.{n}": t.to(cast).contiguous() for n, t in weights.items()}
        save_file(tensors, str(partial / PEFT_WEIGHTS), metadata={"format": "pt"})
        base = cfg.model.init_from
        config = peft_config(
            cfg.model.lora,
            targets,
            str(base) if base else None,
            causal_lm=is_hf,
            fan_in_fan_out=fan_in_fan_out,
        )
        (partial / PEFT_CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        _publish(partial, to, _meta(checkpoint, "peft-adapters", dtype, cfg, base=base))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {
        "source": checkpoint,
        "step": step_of(checkpoint),
        "parameters": sum(t.numel() for t in weights.values()),
    }


def _meta(checkpoint: Path, weights: str, dtype: str, cfg: Any, **more: Any) -> dict[str, Any]:
    """export.json: what was exported, from which checkpoint of which model."""
    from hpctrain.rundir.checkpoints import step_of

    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "step": step_of(checkpoint),
        "source": str(checkpoint),
        "weights": weights,
        "dtype": dtype,
        "model": {"_target_": cfg.model.target, **cfg.model.args},
        **more,
    }


def _publish(partial: Path, to: Path, meta: dict[str, Any]) -> None:
    """The export's metadata written last, then its folder put in place of ``to`` in one rename (``to``: none,
    or the empty folder check_destination allowed)."""
    (partial / EXPORT_META).write_text(json.dumps(meta, indent=1, default=str) + "\n")
    if to.exists():
        to.rmdir()
    os.replace(partial, to)


def _save_safetensors(weights: dict[str, Any], folder: Path, max_bytes: int) -> None:
    """One ``model.safetensors``, or shards with transformers' index when larger than ``max_bytes``."""
    from safetensors.torch import save_file

    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
