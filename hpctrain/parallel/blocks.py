"""A model's repeated blocks: the units of FSDP sharding, activation checkpointing and compile.

Named by ``parallel.block_classes`` (class names), or found: the children of the ``nn.ModuleList`` /
``nn.ModuleDict`` that holds the most parameters (GPT-2's ``transformer.h``, Llama's ``model.layers``, the
built-ins' ``layers``), as torchtitan and Lightning's FSDP auto-wrap policies pick the transformer layers.
A model without such a container has no blocks: FSDP then shards it as one unit, and activation
checkpointing and compile apply to nothing (checkpointing the whole model saves no memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from hpctrain.errors import ConfigError


@dataclass
class Block:
    parent: nn.Module  # the container (ModuleList / ModuleDict) or module holding it
    key: str  # its name in the parent
    module: nn.Module
    name: str  # qualified name in the model


def find_blocks(model: nn.Module, block_classes: Sequence[str] = ()) -> list[Block]:
    """The model's blocks in module order (see the module docstring)."""
    if block_classes:
        return _by_class(model, block_classes)
    best: tuple[int, str, nn.Module] | None = None
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None or best[0] == 0:
        return []
    _, name, container = best
    return [
        Block(container, key, child, f"{name}.{key}" if name else key)
        for key, child in container.named_children()
    ]


def _by_class(model: nn.Module, block_classes: Sequence[str]) -> list[Block]:
    wanted = set(block_classes)
    found: list[Block] = []
    seen: set[str] = set()
    inside: list[str] = []  # qualified names of blocks found: their descendants are not blocks of their own
    modules = dict(model.named_modules())
    for name, module in modules.items():
        cls = type(module)
        if cls.__name__ not in wanted and cls.__qualname__ not in wanted:
            continue
        if not name:
            raise ConfigError(
                "parallel.block_classes", cls.__name__, "is the model itself, not a block of it"
            )
        if any(name.startswith(outer + ".") for outer in inside):
            continue
        parent_name, _, key = name.rpartition(".")
        found.append(Block(modules[parent_name], key, module, name))
        inside.append(name)
        seen.add(cls.__name__)
    missing = [
        c for c in block_classes if c not in seen and not any(type(b.module).__qualname__ == c for b in found)
    ]
    if missing:
        # Repeated modules first (the children of module lists and dicts), then the others with parameters.
        repeated = [
            type(c).__name__
            for m in modules.values()
            if isinstance(m, nn.ModuleList | nn.ModuleDict)
            for c in m.children()
        ]
        others = [
            type(m).__name__ for name, m in modules.items() if name and any(True for _ in m.parameters())
        ]
        names = list(dict.fromkeys([*repeated, *others]))
        raise ConfigError(
            "parallel.block_classes",
            missing[0],
            "no module of this class in the model",
            valid=", ".join(names[:12]),
        )
    return found


def replace_block(block: Block, new: nn.Module) -> None:
    """Put ``new`` where ``block`` was (a ModuleList index, a ModuleDict key or an attribute)."""
    if isinstance(block.parent, nn.ModuleList):
        block.parent[int(block.key)] = new
    elif isinstance(block.parent, nn.ModuleDict):
        block.parent[block.key] = new
    else:
        setattr(block.parent, block.key, new)
    block.module = new
