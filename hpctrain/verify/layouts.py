"""The parallel layouts the verification tools run, and the tiny models they train: the one table of them.

:mod:`hpctrain.verify.parity`, :mod:`hpctrain.verify.plan_measure` and ``bench/parallel.py`` pick layouts
from :data:`LAYOUTS` by name and add what they vary on top (micro-batch size, activation checkpointing,
precision, optimizer, compression). A layout is its world size and the ``parallel`` overrides that give its
degrees and schedule. Hydra overrides only: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    name: str
    ranks: int  # the world size (cluster.nproc)
    overrides: tuple[str, ...]  # the parallel group and its settings

    def args(self) -> list[str]:
        """The overrides that give this layout."""
        return [f"cluster.nproc={self.ranks}", *self.overrides]


class OnLayout:
    """A case run on one of :data:`LAYOUTS` (a frozen dataclass with ``layout`` and ``name`` fields): named
    like its layout unless given a name, on as many ranks as the layout has."""

    layout: Layout
    name: str

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.layout.name)

    @property
    def ranks(self) -> int:
        return self.layout.ranks


_LAYOUTS = [
    Layout("none", 1, ("parallel=none",)),
    Layout("ddp", 2, ("parallel=ddp",)),
    Layout("fsdp zero3", 2, ("parallel=fsdp",)),
    Layout("fsdp zero2", 2, ("parallel=fsdp", "parallel.reshard_after_forward=false")),
    Layout("fsdp offload", 2, ("parallel=fsdp", "parallel.cpu_offload=true")),
    Layout("tp", 2, ("parallel=tp", "parallel.sequence_parallel=false")),
    Layout("tp + sp", 2, ("parallel=tp", "parallel.sequence_parallel=true")),
    Layout("pp gpipe", 2, ("parallel=pp", "parallel.schedule=gpipe", "parallel.microbatches=4")),
    Layout("pp 1f1b", 2, ("parallel=pp", "parallel.schedule=1f1b", "parallel.microbatches=4")),
    Layout(
        "pp interleaved 1f1b",
        2,
        ("parallel=pp", "parallel.schedule=interleaved_1f1b", "parallel.microbatches=4"),
    ),
    Layout(
        "pp interleaved zero bubble",
        2,
        ("parallel=pp", "parallel.schedule=interleaved_zero_bubble", "parallel.microbatches=4"),
    ),
    Layout(
        "pp zbv zero bubble",
        2,
        ("parallel=pp", "parallel.schedule=zbv_zero_bubble", "parallel.microbatches=4"),
    ),
    Layout("2d (fsdp 2 × tp 2)", 4, ("parallel=2d",)),
    Layout("hsdp (2 × 2)", 4, ("parallel=hsdp",)),
    Layout("3d (pp 2 × tp 2)", 4, ("parallel=3d", "parallel.microbatches=2")),
    Layout("3d (pp 2 × fsdp 2 × tp 2)", 8, ("parallel=3d", "parallel.microbatches=2")),
    # Context parallelism (the sequence split over cp ranks, ring attention) alone and with FSDP and TP.
    Layout("cp 2", 2, ("parallel=cp",)),
    Layout("cp 4", 4, ("parallel=cp",)),
    Layout("cp 2 × tp 2", 4, ("parallel=4d", "parallel.pp=1", "parallel.cp=2", "parallel.tp=2")),
    Layout("cp 2 × fsdp 2", 4, ("parallel=fsdp", "parallel.cp=2")),
    # Expert parallelism (a mixture of experts' experts over data-parallel ranks) alone and with FSDP.
    Layout("ep 2", 2, ("parallel=fsdp", "parallel.ep=2")),
    Layout("ep 2 × fsdp 2", 4, ("parallel=fsdp", "parallel.ep=2")),
    Layout("ep 2 × tp 2", 4, ("parallel=2d", "parallel.ep=2", "parallel.tp=2")),
    Layout("4d (pp 2 × cp 2 × tp 2)", 8, ("parallel=4d", "parallel.microbatches=2")),
]
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in _LAYOUTS}

# The tiny models of parity and plan_measure (bench/parallel.py times a larger GPT of its own).
MODELS = {
    "gpt": [
        "model=gpt",
        "model.n_layers=4",
        "model.d_model=64",
        "model.n_heads=4",
        "model.seq_len=32",
        # Untied, so every layout also checks a head of its own; the tied cases of hpctrain.verify.parity add
        # model.tie_embeddings=true (under a pipeline: Megatron's embedding group, hpctrain.parallel.shared).
        "model.tie_embeddings=false",
    ],
    # GPT at the sequence length context parallelism is for (the acceptance: 1024).
    "gpt_long": [
        "model=gpt",
        "model.n_layers=2",
        "model.d_model=64",
        "model.n_heads=2",
        "model.seq_len=1024",
        "model.tie_embeddings=false",
    ],
    # GPT with LoRA adapters on its attention's q and v (the base frozen; from its own init here).
    "gpt_lora": [
        "model=gpt",
        "model.n_layers=4",
        "model.d_model=64",
        "model.n_heads=4",
        "model.seq_len=32",
        "model.tie_embeddings=false",
        "model.adapters=lora",
        "model.lora.rank=4",
    ],
    # A 4-expert top-2 mixture of experts in every block (dropless).
    "gpt_moe": [
        "model=gpt_moe",
        "model.n_layers=2",
        "model.d_model=64",
        "model.n_heads=4",
        "model.seq_len=32",
        "model.tie_embeddings=false",
        "model.moe.experts=4",
        "model.moe.top_k=2",
    ],
    "vit": [
        "model=vit",
        "model.n_layers=4",
        "model.d_model=64",
        "model.n_heads=4",
        "model.image_size=8",
        "model.patch_size=2",  # 16 patches + the class token: 17 tokens, split unevenly over tp=2
    ],
}
