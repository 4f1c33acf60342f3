"""torch.compile applied per block (the blocks :mod:`hpctrain.parallel.blocks` finds).

Compiling blocks rather than the whole model keeps parameter names unchanged (checkpoints resume under any
layout) and lets one graph serve every identical block; torchtitan compiles per block for the same reasons.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from hpctrain.parallel.blocks import find_blocks


def apply_compile(model: nn.Module, block_classes: Sequence[str] = ()) -> None:
    """Compile each block in place (``Module.compile`` keeps parameter names, unlike ``torch.compile(m)``).
    Blocks are identical, so one graph serves all of them."""
    for block in find_blocks(model, block_classes):
        block.module.compile()
