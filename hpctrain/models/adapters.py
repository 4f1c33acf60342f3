"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), added to a built
model from outside it: ``model.adapters=lora``.

Each targeted ``nn.Linear`` keeps its weight, frozen, and gains two children, ``lora_A`` (in → rank, PEFT's
Kaiming-uniform init) and ``lora_B`` (rank → out, zeros: the adapted model starts as the base), and a
forward hook adding ``(alpha / rank) · lora_B(lora_A(dropout(x)))`` to its output (eq. 3 of the paper).
Every other parameter is frozen. The names are PEFT's (``<module>.lora_A.weight``), so the adapters export
as a PEFT adapter and a merged model is the base weights with ``W + (alpha / rank) · B A``.

transformers' ``Conv1D`` (GPT-2's projections: a Linear whose weight is stored transposed, [in, out]) is
adapted alike: the same ``lora_A`` / ``lora_B`` (PEFT's ``fan_in_fan_out``), its merge adds ``(B A)ᵀ``.

A hook rather than a wrapper class keeps each Linear what it was: tensor-parallel plans, float8 conversion,
FSDP units and checkpoint names of the base weights are unchanged.

Targets: ``model.lora.targets`` (module-name patterns, dotted, ``*`` one level; a pattern also matches the
end of a longer name, as PEFT's ``target_modules`` do), else the model class's ``LORA_TARGETS``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.config.schema import LoraConfig
from hpctrain.errors import ConfigError
from hpctrain.models.facts import module_matches

ADAPTER_NAMES = ("lora_A", "lora_B")


def is_transposed_linear(module: nn.Module) -> bool:
    """transformers' ``Conv1D``: ``x @ W + b`` with ``W`` [in, out] (GPT-2's projections). Looked up where
    transformers is already imported: a model built without it holds none."""
    utils = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(utils, "Conv1D", None)
    return conv1d is not None and isinstance(module, conv1d)


def linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a Linear or a transposed one (:func:`is_transposed_linear`); None otherwise."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if is_transposed_linear(module):
        inp, out = module.weight.shape
        return inp, out
    return None


def transposed_modules(model: nn.Module) -> set[str]:
    """The names of ``model``'s transposed Linears (their merged update is ``(B A)ᵀ``)."""
    return {name for name, module in model.named_modules() if is_transposed_linear(module)}


def lora_targets(model: nn.Module, lora: LoraConfig) -> list[tuple[str, nn.Module]]:
    """The Linear modules ``lora`` adapts, with their names; else one line saying what to name."""
    name = type(model).__name__
    patterns = list(lora.targets) or list(getattr(type(model), "LORA_TARGETS", ()))
    if not patterns:
        raise ConfigError(
            "model.lora.targets",
            "[]",
            f"model {name} declares no LORA_TARGETS",
            valid="module-name patterns of its Linear layers, e.g. ['q_proj', 'v_proj'] or ['attn.q']",
        )
    found: dict[str, nn.Linear] = {}
    for pattern in patterns:
        hits = [(n, m) for n, m in model.named_modules() if n and module_matches(n, pattern)]
        if not hits:
            raise ConfigError("model.lora.targets", pattern, f"names no module of {name}")
        for module_name, module in hits:
            if linear_dims(module) is None:
                raise ConfigError(
                    "model.lora.targets",
                    pattern,
                    f"names {module_name}, a {type(module).__name__}",
                    valid="nn.Linear (or transformers' Conv1D) modules",
                )
            found[module_name] = module
    return sorted(found.items())


def add_lora(model: nn.Module, lora: LoraConfig) -> list[str]:
    """Freeze ``model`` and add LoRA adapters to its targets (see the module docstring); returns their
    names. The adapters are built on the base weight's device and dtype (meta stays meta)."""
    targets = lora_targets(model, lora)
    for param in model.parameters():
        param.requires_grad_(False)
    scale = lora.alpha / lora.rank
    for _, linear in targets:
        weight = linear.weight
        inp, out = linear_dims(linear) or (0, 0)
        a = nn.Linear(inp, lora.rank, bias=False, device=weight.device, dtype=weight.dtype)
        b = nn.Linear(lora.rank, out, bias=False, device=weight.device, dtype=weight.dtype)
        if weight.device.type != "meta":
            nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))  # PEFT's init of A
            nn.init.zeros_(b.weight)
        linear.lora_A, linear.lora_B = a, b
        linear.register_forward_hook(_adapt_hook(scale, lora.dropout))
    return [name for name, _ in targets]


def _adapt_hook(scale: float, dropout: float) -> Any:
    def adapt(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        x = F.dropout(args[0], dropout, module.training) if dropout > 0 else args[0]
        return output + module.lora_B(module.lora_A(x)) * scale

    return adapt


def adapter_names(names: Iterator[str] | list[str]) -> list[str]:
    """Of parameter names, those of adapters."""
    return [n for n in names if any(f".{a}." in f".{n}" for a in ADAPTER_NAMES)]


def merged(
    weights: dict[str, torch.Tensor], lora: LoraConfig, transposed: set[str] | frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """The base weights with every adapter folded in (``W + (alpha / rank) · B A`` in fp32; its transpose
    for the modules named in ``transposed``, whose ``W`` is [in, out]), adapters gone."""
    scale = lora.alpha / lora.rank
    out = {n: t for n, t in weights.items() if not adapter_names([n])}
    for name in adapter_names(list(weights)):
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        a, b = weights[name].float(), weights[f"{module}.lora_B.weight"].float()
        base = out[f"{module}.weight"]
        delta = b @ a
        out[f"{module}.weight"] = (base.float() + scale * (delta.T if module in transposed else delta)).to(
            base.dtype
        )
    return out


def peft_config(
    lora: LoraConfig, targets: list[str], base: str | None, causal_lm: bool, fan_in_fan_out: bool = False
) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for these adapters (``target_modules``: the adapted modules' names;
    ``fan_in_fan_out`` where they are transposed Linears: PEFT then merges ``(B A)ᵀ`` as :func:`merged`)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM" if causal_lm else None,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "base_model_name_or_path": base,
        "inference_mode": True,
    }
