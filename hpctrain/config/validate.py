"""Reject a bad run before any process starts: each rule raises a one-line ConfigError with the numbers.

Runs on the submitting machine (no torch import). Rules are grouped by config group, then combinations.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hpctrain.checkpoint import layout as checkpoint_layout
from hpctrain.config.errors import ConfigError
from hpctrain.config.schema import Config, DataConfig, GPTConfig, ViTConfig
from hpctrain.slurm.spec import (
    ENV_NAME,
    SAFE_CONSTRAINT,
    SAFE_CONTAINER,
    SAFE_MOUNT,
    SAFE_SLURM_TOKEN,
    TIME_FORMATS_HELP,
    parse_time_limit,
)

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
PARALLEL_STRATEGIES = ("none", "ddp")
CLUSTER_KINDS = ("local", "slurm")
LAUNCHERS = {"local": ("auto", "local"), "slurm": ("auto", "submitit", "sbatch")}
SBATCH_TEMPLATES = ("srun", "torchrun")
# USR1 is left to NCCL; KILL and STOP cannot be caught.
WARNING_SIGNALS = ("USR2", "TERM", "INT", "HUP", "URG")
WANDB_MODES = ("offline", "online", "disabled")


def validate(cfg: Config, run_dir: str | Path | None = None) -> None:
    _check_model(cfg.model)
    check_data(cfg.data, cfg.model)
    _check_cluster(cfg)
    _check_parallel(cfg)
    _check_optim(cfg)
    _check_trainer(cfg)
    _check_logger(cfg)
    _check_batch(cfg)
    if run_dir is not None:
        check_writable_dir("hydra.run.dir", Path(run_dir))


def world_size(cfg: Config) -> int:
    c = cfg.cluster
    return c.nproc if c.kind == "local" else c.nodes * c.tasks_per_node


def data_parallel_size(cfg: Config) -> int:
    return 1 if cfg.parallel.name == "none" else world_size(cfg)


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


def _check_cluster(cfg: Config) -> None:
    c = cfg.cluster
    _one_of("cluster.kind", c.kind, CLUSTER_KINDS)
    _one_of("launcher", cfg.launcher, LAUNCHERS[c.kind])
    _at_least("cluster.dist_timeout_s", c.dist_timeout_s, 1)
    if c.kind == "local":
        _at_least("cluster.nproc", c.nproc, 1)
        return
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "array_parallelism"):
        _at_least(f"cluster.{key}", getattr(c, key), 1)
    for key in ("gpus_per_node", "max_requeues", "signal_lead_s"):
        _at_least(f"cluster.{key}", getattr(c, key), 0)
    if c.gpus_per_node and c.tasks_per_node > c.gpus_per_node:
        raise ConfigError(
            "cluster.tasks_per_node",
            c.tasks_per_node,
            f"one task per GPU, and cluster.gpus_per_node={c.gpus_per_node}",
            valid=f"1..{c.gpus_per_node}",
        )
    try:
        minutes = parse_time_limit(c.time)
    except ValueError:
        raise ConfigError("cluster.time", c.time, "not a Slurm time limit", valid=TIME_FORMATS_HELP) from None
    if c.signal_lead_s >= minutes * 60:
        raise ConfigError(
            "cluster.signal_lead_s",
            c.signal_lead_s,
            f"the warning would come before the job starts: cluster.time={c.time} is {minutes * 60} s",
            valid=f"< {minutes * 60}",
        )
    _one_of("cluster.signal", c.signal, WARNING_SIGNALS)
    _one_of("cluster.sbatch_template", c.sbatch_template, SBATCH_TEMPLATES)
    for key in ("partition", "account", "qos", "exclude", "job_name", "mem"):
        value = getattr(c, key)
        if value is not None and not SAFE_SLURM_TOKEN.match(value):
            raise ConfigError(
                f"cluster.{key}",
                value,
                "contains characters a shell or sbatch would act on",
                valid="letters, digits and _ . , : @ % + = [ ] -",
            )
    if c.constraint is not None and not SAFE_CONSTRAINT.match(c.constraint):
        raise ConfigError(
            "cluster.constraint",
            c.constraint,
            "not a Slurm feature expression",
            valid="features joined by & | , with [ ] ( ) *",
        )
    for name in c.env:
        if not ENV_NAME.match(name):
            raise ConfigError(f"cluster.env.{name}", c.env[name], "not a valid environment variable name")
    for line in c.setup:
        try:
            shlex.split(line)
        except ValueError as err:
            raise ConfigError("cluster.setup", line, f"cannot be split into words: {err}") from None
    if c.container_image is not None and not SAFE_CONTAINER.match(c.container_image):
        raise ConfigError("cluster.container_image", c.container_image, "not an image reference or path")
    for mount in c.container_mounts:
        if not SAFE_MOUNT.match(mount):
            raise ConfigError("cluster.container_mounts", mount, "not a mount", valid="SRC:DST[:FLAGS]")


def _check_parallel(cfg: Config) -> None:
    _one_of("parallel", cfg.parallel.name, PARALLEL_STRATEGIES)
    _at_least("parallel.bucket_cap_mb", cfg.parallel.bucket_cap_mb, 0.0)
    if cfg.parallel.name == "none" and world_size(cfg) != 1:
        key = "cluster.nproc" if cfg.cluster.kind == "local" else "cluster.nodes"
        raise ConfigError(
            key,
            getattr(cfg.cluster, key.split(".")[1]),
            f"parallel=none runs one process, this gives {world_size(cfg)}",
            valid="a single process, or parallel=ddp",
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
    if t.global_batch_size is not None:
        _at_least("trainer.global_batch_size", t.global_batch_size, 1)
    for key in (
        "max_steps",
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
    for key in ("fail_at", "hang_at"):
        value = getattr(t, key)
        rank, _, step = (value or "0:0").partition(":")
        if not (rank.isdigit() and step.isdigit()):
            raise ConfigError(f"trainer.{key}", value, "expected RANK:STEP", valid="e.g. 1:5")
    for key in ("watchdog_factor", "watchdog_min_s", "save_delay_s"):
        _at_least(f"trainer.{key}", getattr(t, key), 0.0)


def _check_logger(cfg: Config) -> None:
    _one_of("logger.wandb_mode", cfg.logger.wandb_mode, WANDB_MODES)


def global_batch_size(cfg: Config) -> int:
    """Samples per optimizer step: as configured, or one micro-batch per data-parallel rank."""
    t = cfg.trainer
    return (
        t.global_batch_size
        if t.global_batch_size is not None
        else t.micro_batch_size * data_parallel_size(cfg)
    )


def _check_batch(cfg: Config) -> None:
    t, dp = cfg.trainer, data_parallel_size(cfg)
    per_step = t.micro_batch_size * dp
    if t.global_batch_size is not None and t.global_batch_size % per_step:
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
