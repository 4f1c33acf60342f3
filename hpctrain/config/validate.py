"""Reject a bad run before any process starts: each rule raises a one-line ConfigError with the numbers.

Runs on the submitting machine (no torch import). Rules are grouped by config group, then combinations.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.checkpoint import layout as checkpoint_layout
from hpctrain.config.errors import ConfigError
from hpctrain.config.schema import Config, DataConfig, GPTConfig, ViTConfig

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
PARALLEL_STRATEGIES = ("none", "ddp")
LAUNCHERS = ("local",)
WANDB_MODES = ("offline", "online", "disabled")


def validate(cfg: Config, run_dir: str | Path | None = None) -> None:
    _check_model(cfg.model)
    check_data(cfg.data, cfg.model)
    _check_parallel(cfg)
    _check_optim(cfg)
    _check_trainer(cfg)
    _check_logger(cfg)
    _check_batch(cfg)
    if run_dir is not None:
        check_writable_dir("hydra.run.dir", Path(run_dir))


def data_parallel_size(cfg: Config) -> int:
    return 1 if cfg.parallel.name == "none" else cfg.cluster.nproc


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, "not a known choice", valid=", ".join(allowed))


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(key, value, f"must be ≥ {low}")


def _check_model(model: GPTConfig | ViTConfig) -> None:
    for name in ("n_layers", "d_model", "n_heads", "mlp_ratio"):
        _at_least(f"model.{name}", getattr(model, name), 1)
    if model.d_model % model.n_heads:
        raise ConfigError(
            "model.n_heads",
            model.n_heads,
            f"must divide model.d_model={model.d_model} "
            f"({model.d_model} % {model.n_heads} = {model.d_model % model.n_heads})",
        )
    if not 0.0 <= model.dropout < 1.0:
        raise ConfigError("model.dropout", model.dropout, "must be in [0, 1)")
    if isinstance(model, GPTConfig):
        _at_least("model.vocab_size", model.vocab_size, 2)
        _at_least("model.seq_len", model.seq_len, 1)
    elif isinstance(model, ViTConfig):
        for name in ("image_size", "patch_size", "in_channels", "num_classes"):
            _at_least(f"model.{name}", getattr(model, name), 1)
        if model.image_size % model.patch_size:
            raise ConfigError(
                "model.patch_size", model.patch_size, f"must divide model.image_size={model.image_size}"
            )


def check_data(data: DataConfig, model: GPTConfig | ViTConfig) -> None:
    """Can ``data`` feed ``model``? Also called by the dataset builder in each worker."""
    from hpctrain.data.catalog import DATASET_KINDS, MODEL_INPUT_KIND, fixed_image_shape, fixed_vocab

    _one_of("data", data.name, tuple(DATASET_KINDS))
    gives, needs = DATASET_KINDS[data.name], MODEL_INPUT_KIND[model.arch]
    if gives not in ("any", needs):
        fitting = [n for n, k in DATASET_KINDS.items() if k in ("any", needs)]
        raise ConfigError(
            "data", data.name, f"gives {gives} but model={model.arch} needs {needs}", valid=", ".join(fitting)
        )
    if not 0.0 < data.val_fraction <= 0.5:
        raise ConfigError("data.val_fraction", data.val_fraction, "must be in (0, 0.5]")
    _at_least("data.num_samples", data.num_samples, 2)
    _at_least("data.max_bytes", data.max_bytes, 1024)
    shape = fixed_image_shape(data.name)
    if shape is not None and isinstance(model, ViTConfig):
        channels, height, width, classes = shape
        for key, have, want in (
            ("image_size", model.image_size, height),
            ("in_channels", model.in_channels, channels),
            ("num_classes", model.num_classes, classes),
        ):
            if have != want:
                raise ConfigError(
                    f"model.{key}",
                    have,
                    f"data={data.name} gives {channels}×{height}×{width} images in {classes} classes",
                    valid=str(want),
                )
    vocab = fixed_vocab(data.name)
    if data.name == "tokens":
        vocab = _token_file_vocab(data.path)
    if vocab is not None and isinstance(model, GPTConfig) and vocab > model.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            model.vocab_size,
            f"data={data.name} has a vocabulary of {vocab} tokens",
            valid=f"≥ {vocab}",
        )


def _token_file_vocab(path: str | None) -> int:
    from hpctrain.data.catalog import read_token_header

    if path is None or path == "???":
        raise ConfigError(
            "data.path", path, "required for data=tokens", valid="a .bin written by `hpctrain prepare`"
        )
    header = Path(path).with_suffix(".json")
    if not Path(path).is_file() or not header.is_file():
        raise ConfigError(
            "data.path", path, f"no token file there (need {Path(path).name} and {header.name})"
        )
    try:
        return int(read_token_header(path)["vocab_size"])
    except (ValueError, KeyError) as err:
        raise ConfigError("data.path", path, f"unreadable header {header.name}: {err}") from None


def _check_parallel(cfg: Config) -> None:
    _one_of("parallel", cfg.parallel.name, PARALLEL_STRATEGIES)
    _one_of("cluster.launcher", cfg.cluster.launcher, LAUNCHERS)
    _at_least("cluster.nproc", cfg.cluster.nproc, 1)
    _at_least("cluster.dist_timeout_s", cfg.cluster.dist_timeout_s, 1)
    _at_least("parallel.bucket_cap_mb", cfg.parallel.bucket_cap_mb, 0.0)
    if cfg.parallel.name == "none" and cfg.cluster.nproc != 1:
        raise ConfigError(
            "cluster.nproc", cfg.cluster.nproc, "parallel=none runs one process", valid="1, or parallel=ddp"
        )


def _check_optim(cfg: Config) -> None:
    optim = cfg.optim
    _one_of("optim", optim.name, OPTIMIZERS)
    if optim.lr <= 0:
        raise ConfigError("optim.lr", optim.lr, "must be > 0")
    _at_least("optim.weight_decay", optim.weight_decay, 0.0)
    _at_least("optim.warmup_steps", optim.warmup_steps, 0)
    _at_least("optim.grad_clip", optim.grad_clip, 0.0)
    if not 0.0 <= optim.min_lr_ratio <= 1.0:
        raise ConfigError("optim.min_lr_ratio", optim.min_lr_ratio, "must be in [0, 1]")
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(optim, key) < 1.0:
            raise ConfigError(f"optim.{key}", getattr(optim, key), "must be in [0, 1)")


def _check_trainer(cfg: Config) -> None:
    t = cfg.trainer
    for key in (
        "max_steps",
        "global_batch_size",
        "micro_batch_size",
        "log_every",
        "keep_last",
        "eval_batches",
    ):
        _at_least(f"trainer.{key}", getattr(t, key), 1)
    for key in ("ckpt_every", "eval_every"):
        _at_least(f"trainer.{key}", getattr(t, key), 0)
    _one_of("trainer.precision", t.precision, PRECISIONS)
    if t.resume not in ("auto", "never"):
        problem = checkpoint_layout.problem_with(Path(t.resume))
        if problem:
            raise ConfigError(
                "trainer.resume",
                t.resume,
                f"not a loadable checkpoint: {problem}",
                valid="auto, never, or a committed checkpoints/step_* directory",
            )
    if t.fail_at is not None:
        rank, _, step = t.fail_at.partition(":")
        if not (rank.isdigit() and step.isdigit()):
            raise ConfigError("trainer.fail_at", t.fail_at, "expected RANK:STEP", valid="e.g. 1:5")


def _check_logger(cfg: Config) -> None:
    _one_of("logger.wandb_mode", cfg.logger.wandb_mode, WANDB_MODES)


def _check_batch(cfg: Config) -> None:
    t, dp = cfg.trainer, data_parallel_size(cfg)
    per_step = t.micro_batch_size * dp
    if t.global_batch_size % per_step:
        lower = max(per_step, t.global_batch_size // per_step * per_step)
        raise ConfigError(
            "trainer.global_batch_size",
            t.global_batch_size,
            f"must be a multiple of micro_batch_size × data-parallel size = "
            f"{t.micro_batch_size} × {dp} = {per_step}",
            valid=f"e.g. {lower} or {lower + per_step}",
        )


def check_writable_dir(key: str, path: Path) -> None:
    """The nearest existing ancestor must be a writable directory, so the run can create ``path``."""
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(key, path, f"cannot create a directory there: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(key, path, f"cannot create a directory there: {probe} is not writable")
