"""The built-in GPT at the sizes the growth benchmarks sweep (resume_cost.py, cost_growth.py).

Parameters ≈ 12·L·d² (attention 4d², MLP 8d² per block; the byte-level vocabulary of 256 adds little), so
~10M, ~40M and ~120M are 6 × 384, 8 × 640 and 12 × 896; heads of 64 dimensions, as GPT-2's. "1M" is for
smoke runs only.
"""

from __future__ import annotations

# name: (n_layers, d_model, n_heads)
SIZES: dict[str, tuple[int, int, int]] = {
    "1M": (2, 192, 3),
    "10M": (6, 384, 6),
    "40M": (8, 640, 10),
    "120M": (12, 896, 14),
}
DEFAULT = ["10M", "40M", "120M"]


def model_overrides(size: str, seq_len: int, group: bool = True) -> list[str]:
    """The overrides of the GPT of ``size``; ``group=False`` leaves out ``model=gpt`` (for a caller that
    chose the group already: Hydra refuses a group chosen twice)."""
    layers, width, heads = SIZES[size]
    return [
        *(["model=gpt"] if group else []),
        f"model.n_layers={layers}",
        f"model.d_model={width}",
        f"model.n_heads={heads}",
        f"model.seq_len={seq_len}",
    ]
