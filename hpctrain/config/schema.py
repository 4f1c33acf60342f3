"""Typed structured configs: one dataclass per config group, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` pick a schema through their defaults list (``- /schema/model/gpt@_here_``
style is avoided: each option names its schema as ``_schema_`` via the defaults list), so an unknown key or
a value of the wrong type is rejected while the config is composed, before anything runs.

This module must stay free of torch: it is imported on the submit path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class GPTConfig:
    """A GPT-style decoder (pre-norm blocks, causal attention, learned positions)."""

    arch: str = "gpt"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    vocab_size: int = 256
    seq_len: int = 64
    tie_embeddings: bool = True


@dataclass
class ViTConfig:
    """A Vision Transformer (patch embedding, class token, pre-norm blocks)."""

    arch: str = "vit"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    image_size: int = 8
    patch_size: int = 2
    in_channels: int = 1
    num_classes: int = 10


@dataclass
class DataConfig:
    """Where samples come from.

    ``name``: ``synthetic`` (shaped by the model: tokens for gpt, images for vit), ``text`` (byte-level
    Python standard library sources), ``digits`` (scikit-learn's 8×8 handwritten digits), ``tokens``
    (a memory-mapped token file written by ``hpctrain prepare``).
    """

    name: str = "synthetic"
    path: str | None = None  # the token file, for name=tokens
    num_samples: int = 8192  # synthetic only
    max_bytes: int = 4_000_000  # text only: how much of the corpus to read
    val_fraction: float = 0.05


@dataclass
class ParallelConfig:
    """How the model is spread over the ranks. ``none``: one process; ``ddp``: data parallel."""

    name: str = "ddp"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False


@dataclass
class ClusterConfig:
    """Where the run executes. ``local``: ``nproc`` worker processes on this machine."""

    name: str = "local"
    launcher: str = "local"
    nproc: int = 2
    master_addr: str = "127.0.0.1"
    # Peak dense bf16 FLOP/s of one device, for MFU. None: look it up from the GPU's name, else no MFU.
    peak_flops: float | None = None
    dist_timeout_s: int = 300
    # Seconds the launcher waits for the other ranks to stop after one failed, before SIGKILL.
    kill_grace_s: float = 5.0


@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warmup, then cosine decay to ``lr * min_lr_ratio``)."""

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.9  # sgd only
    nesterov: bool = False  # sgd only
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping


@dataclass
class TrainerConfig:
    max_steps: int = 300
    seed: int = 1234
    global_batch_size: int = 32
    micro_batch_size: int = 16
    precision: str = "fp32"  # fp32 | bf16 | fp16
    log_every: int = 25
    eval_every: int = 100  # 0: evaluate only at the end
    eval_batches: int = 4
    ckpt_every: int = 100  # 0: only at the end
    keep_last: int = 2
    resume: str = "auto"  # auto | never | a checkpoint directory
    # Test-only fault injection: "RANK:STEP" makes that rank raise at that step.
    fail_at: str | None = None


@dataclass
class LoggerConfig:
    progress_bar: bool = True
    wandb: bool = False
    wandb_project: str = "hpctrain"
    wandb_entity: str | None = None
    wandb_mode: str = "offline"  # offline | online | disabled
    wandb_tags: list[str] = field(default_factory=list)


@dataclass
class Config:
    model: Any = MISSING
    data: DataConfig = MISSING
    parallel: ParallelConfig = MISSING
    cluster: ClusterConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING


GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"gpt": GPTConfig, "vit": ViTConfig},
    "data": {"data": DataConfig},
    "parallel": {"parallel": ParallelConfig},
    "cluster": {"cluster": ClusterConfig},
    "optim": {"optim": OptimConfig},
    "trainer": {"trainer": TrainerConfig},
    "logger": {"logger": LoggerConfig},
}

MODEL_SCHEMAS: dict[str, type] = GROUP_SCHEMAS["model"]


def register_configs() -> None:
    """Register the schemas so that ``conf/<group>/*.yaml`` can extend ``schema/<group>/<name>``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="hpctrain_schema", node=Config)
    for group, schemas in GROUP_SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
