"""Pipeline stages of any model of the shape embed → repeated blocks → head.

The built-in models split themselves (``PIPELINE_INPUT`` / ``PIPELINE_OUTPUT``, see
:mod:`hpctrain.parallel.pipeline`). Any other model is split by a :class:`PipelineSplit`: declared in
``parallel.pp_split`` (``{input: [embed], blocks: blocks, output: [norm, head]}``), read from a transformers
model's ``base_model_pp_plan`` (:mod:`hpctrain.models.hf`), or found: the children of the largest
``nn.ModuleList`` / ``ModuleDict`` are the blocks, the modules registered before it (along its path) the
input and those after it the output. A stage is a copy of the model with the blocks it does not run
removed (the others keep their names: a checkpoint reshards by name) and the input and output modules
of other stages set to None; its forward runs input → its blocks → output in order. A found split is
checked on the meta device before anything starts: the stages run in order must give what the model's
own forward gives, else the model is of another shape and the layout is refused in one line.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch
from torch import nn

from hpctrain import torchapi
from hpctrain.errors import ConfigError
from hpctrain.models.hf import pipeline_split as hf_pipeline_split
from hpctrain.models.spec import PipelineSplit
from hpctrain.parallel.blocks import find_blocks

SPLIT_KEYS = ("input", "blocks", "output")


def declares_own_split(model: nn.Module) -> bool:
    """The built-ins' convention: the model's forward runs with what a stage does not own set to None."""
    return all(hasattr(type(model), a) for a in ("PIPELINE_INPUT", "PIPELINE_OUTPUT")) and isinstance(
        getattr(model, "layers", None), nn.ModuleDict
    )


def pipeline_split(
    model: nn.Module, configured: dict[str, Any] | None = None
) -> tuple[PipelineSplit, str] | None:
    """(split, where it came from) for a model that does not split itself, or None when none is found."""
    if configured:
        listed = {k: configured.get(k) for k in ("input", "output")}
        ends = {k: (v,) if isinstance(v, str) else tuple(v or ()) for k, v in listed.items()}
        return PipelineSplit(ends["input"], str(configured["blocks"]), ends["output"]), "parallel.pp_split"
    declared = hf_pipeline_split(model)
    if declared is not None:
        return declared, f"{type(model).__name__}'s base_model_pp_plan"
    blocks = find_blocks(model)
    if not blocks:
        return None
    container = blocks[0].name.rpartition(".")[0]
    if not container:
        return None  # the model is the block list itself: nothing before or after
    before: list[str] = []
    after: list[str] = []
    parent, prefix = model, ""
    for atom in container.split("."):
        names = [n for n, child in parent.named_children() if child is not None]
        at = names.index(atom)
        before += [prefix + n for n in names[:at]]
        after = [prefix + n for n in names[at + 1 :]] + after
        parent, prefix = parent.get_submodule(atom), f"{prefix}{atom}."
    return PipelineSplit(tuple(before), container, tuple(after)), "the model's largest block list"


def require_split(model: nn.Module, configured: dict[str, Any] | None, n_stages: int) -> PipelineSplit | None:
    """The split of ``model`` over ``n_stages`` (None: it splits itself), or one line saying why not."""
    if declares_own_split(model) and not configured:
        return None
    found = pipeline_split(model, configured)
    name = type(model).__name__
    if found is None:
        raise ConfigError(
            "parallel.pp",
            n_stages,
            f"model {name} has no block list to split into pipeline stages "
            "(an nn.ModuleList of its repeated blocks)",
            valid="parallel.pp_split={input: [...], blocks: NAME, output: [...]}",
        )
    split, source = found
    for module in split.modules():
        try:
            model.get_submodule(module)
        except AttributeError:
            raise ConfigError(source, module, f"names no module of {name}") from None
    container = model.get_submodule(split.blocks)
    if not isinstance(container, (nn.ModuleList, nn.ModuleDict)):
        raise ConfigError(f"{source}.blocks", split.blocks, "is not an nn.ModuleList or nn.ModuleDict")
    if len(container) < n_stages:
        raise ConfigError(
            "parallel.pp",
            n_stages,
            f"{split.blocks} of {name} holds {len(container)} blocks",
            valid=f"at most {len(container)} stages",
        )
    return split


def check_split_runs(model: nn.Module, split: PipelineSplit, example: Any) -> None:
    """On the meta device: the stages run in order give the shape of the model's own output, else the
    model is not embed → blocks → head in that order (one line)."""
    try:
        ours = _run_in_order(model, split, example, first=True, last=True)
    except Exception as err:  # the model's pieces do not run one after the other
        raise _other_shape(
            model, split, f"running them in order fails: {str(err).splitlines()[0][:200]}"
        ) from None
    theirs = model(example)
    theirs = getattr(theirs, "logits", theirs)
    if not isinstance(theirs, torch.Tensor) or tuple(ours.shape) != tuple(theirs.shape):
        shape = tuple(theirs.shape) if isinstance(theirs, torch.Tensor) else type(theirs).__name__
        raise _other_shape(model, split, f"in order they give {tuple(ours.shape)}, its forward {shape}")


def _other_shape(model: nn.Module, split: PipelineSplit, why: str) -> ConfigError:
    return ConfigError(
        "parallel.pp",
        "split",
        f"model {type(model).__name__} is not input {list(split.input)} → blocks "
        f"{split.blocks} → output {list(split.output)}: {why}",
        valid="parallel.pp_split={input: [...], blocks: NAME, output: [...]} naming its pieces",
    )


def sequential_stage(model: nn.Module, split: PipelineSplit, stage: int, n_stages: int) -> nn.Module:
    """A copy of ``model`` that runs stage ``stage`` of ``n_stages``: its share of the blocks (earlier
    stages take one more when they do not divide evenly), the input modules on the first stage, the
    output modules on the last."""
    first, last = stage == 0, stage == n_stages - 1
    part = copy.deepcopy(model)
    owner, _, attr = split.blocks.rpartition(".")
    # A ModuleDict keyed by the blocks' own indices: parameter names stay the whole model's when the other
    # stages' blocks go.
    keyed = nn.ModuleDict(dict(part.get_submodule(split.blocks).named_children()))
    setattr(part.get_submodule(owner) if owner else part, attr, keyed)
    for path in sequential_dropped(model, split, stage, n_stages):
        holder, _, leaf = path.rpartition(".")
        parent = part.get_submodule(holder) if holder else part
        if holder == split.blocks:
            del parent[leaf]
        else:
            setattr(parent, leaf, None)
    part.forward = types.MethodType(  # type: ignore[method-assign]
        lambda self, x: _run_in_order(self, split, x, first, last), part
    )
    return part


def _mine(keys: list[str], stage: int, n_stages: int) -> list[str]:
    """The blocks ``stage`` runs: an even share, earlier stages one more when they do not divide evenly."""
    size, extra = divmod(len(keys), n_stages)
    start = stage * size + min(stage, extra)
    return keys[start : start + size + (stage < extra)]


def sequential_dropped(model: nn.Module, split: PipelineSplit, stage: int, n_stages: int) -> list[str]:
    """The modules (dotted paths) that ``stage`` of ``n_stages`` does not run."""
    keys = [k for k, _ in model.get_submodule(split.blocks).named_children()]
    mine = set(_mine(keys, stage, n_stages))
    dropped = [f"{split.blocks}.{k}" for k in keys if k not in mine]
    if stage != 0:
        dropped += split.input
    if stage != n_stages - 1:
        dropped += split.output
    return dropped


def _run_in_order(module: nn.Module, split: PipelineSplit, x: Any, first: bool, last: bool) -> Any:
    """Input modules (first stage only), the blocks ``module`` holds, output modules (last stage only)."""
    if first:
        for name in split.input:
            x = module.get_submodule(name)(x)
    kwargs = split.block_kwargs(module, x) if split.block_kwargs is not None else {}
    # Looked up on every call: activation checkpointing and compile replace the blocks in place.
    for block in module.get_submodule(split.blocks).children():
        x = block(x, **kwargs)
        x = x[0] if isinstance(x, tuple) else x
    if last:
        for name in split.output:
            x = module.get_submodule(name)(x)
    return x


def merge_stages(parts: list[nn.Module]) -> nn.Module:
    """One module holding several pipeline stages of a rank under the whole model's parameter names, for
    the optimizer and checkpoints. It is never called: the pipeline runs the stages."""
    union = nn.Module()
    _merge(union, parts)
    return union


def _merge(union: nn.Module, nodes: list[nn.Module]) -> None:
    for node in nodes:
        for name, param in node.named_parameters(recurse=False):
            if name not in torchapi.own_parameters(union):
                union.register_parameter(name, param)
    names: dict[str, list[nn.Module]] = {}
    for node in nodes:
        for name, child in node.named_children():
            if child is not None:
                names.setdefault(name, []).append(child)
    for name, children in names.items():
        distinct = list({id(c): c for c in children}.values())
        if len(distinct) == 1:
            union.add_module(name, distinct[0])
        else:
            holder = nn.ModuleDict() if isinstance(distinct[0], nn.ModuleDict) else nn.Module()
            _merge(holder, distinct)
            union.add_module(name, holder)
