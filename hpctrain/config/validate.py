"""Reject a bad run before any process starts: each rule raises a one-line ConfigError with the numbers.

Runs on the submitting machine (no torch import). Rules are grouped by config group, then combinations.

Over 400 lines: one rule function per config group plus the rules that combine groups (layout × cluster,
batch × layout, data × model), which read each other's results; split, they would import one another.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from hpctrain.config.sanity import (
    check_finite,
    check_local_cluster,
    check_no_control_characters,
    check_text,
    check_writable_dir,
)
from hpctrain.config.schema import TP_ROLES, Config, DataConfig
from hpctrain.config.shape import (
    PIPELINE_SCHEDULES,
    STRATEGY_DIMS,
    RunShape,
    degrees,
    run_shape,
    samples_per_pass,
    stages_per_rank,
    world_size,
)
from hpctrain.errors import ConfigError
from hpctrain.faults import check_faults
from hpctrain.precision import PRECISIONS
from hpctrain.rundir import checkpoints as checkpoint_layout
from hpctrain.slurm.spec import (
    DEPENDENCY,
    ENV_NAME,
    MAIL_TYPES,
    MAIL_USER,
    RESERVED_SBATCH,
    SAFE_CONSTRAINT,
    SAFE_CONTAINER,
    SAFE_MOUNT,
    SAFE_SLURM_TOKEN,
    SBATCH_OPTION,
    TIME_FORMATS_HELP,
    parse_time_limit,
)

OPTIMIZERS = ("adamw", "sgd")
PARALLEL_STRATEGIES = tuple(STRATEGY_DIMS)
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")
CLUSTER_KINDS = ("local", "slurm")
LAUNCHERS = {"local": ("auto", "local"), "slurm": ("auto", "submitit", "sbatch")}
SBATCH_TEMPLATES = ("srun", "torchrun")
# USR1 is left to NCCL; KILL and STOP cannot be caught.
WARNING_SIGNALS = ("USR2", "TERM", "INT", "HUP", "URG")
WANDB_MODES = ("offline", "online", "disabled")


def validate(cfg: Config, run_dir: str | Path | None = None) -> RunShape:
    """Every rule below; the run's shape when none fails."""
    check_no_control_characters(cfg)
    check_finite(cfg)
    check_data(cfg.data)
    _check_init_from(cfg.model.init_from)
    _check_task(cfg)
    _check_cluster(cfg)
    _check_parallel(cfg)
    _check_optim(cfg)
    _check_trainer(cfg)
    _check_checkpoint(cfg)
    _check_logger(cfg)
    check_faults(cfg.faults)
    _check_batch(cfg)
    if run_dir is not None:
        check_writable_dir("hydra.run.dir", Path(run_dir))
    return run_shape(cfg)


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, "not a known choice", valid=", ".join(allowed))


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(key, value, f"must be ≥ {low}")


TASKS = ("train", "script")
SCRIPT_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2")


def _check_task(cfg: Config) -> None:
    """``task=script``: a file that exists here (the job runs a snapshot of it), and a signal to forward."""
    t = cfg.task
    _one_of("task", t.name, TASKS)
    if t.name != "script":
        return
    if not t.path or not t.path.strip():
        raise ConfigError(
            "task.path", t.path, "missing or empty", valid="your training script, e.g. train.py"
        )
    path = Path(t.path).expanduser()
    if not path.is_file():
        raise ConfigError("task.path", t.path, "no such file", valid="a path relative to this folder")
    if path.is_absolute() or ".." in path.parts:
        raise ConfigError("task.path", t.path, "not inside this folder (the job runs a snapshot of it)",
                          valid="a relative path without ..")  # fmt: skip
    _one_of("task.signal", t.signal, SCRIPT_SIGNALS)
    if cfg.cluster.kind == "slurm" and t.signal == cfg.cluster.signal:
        raise ConfigError("task.signal", t.signal, "is cluster.signal itself: the script would get it twice",
                          valid=", ".join(s for s in SCRIPT_SIGNALS if s != cfg.cluster.signal))  # fmt: skip


def _check_init_from(path: str | None) -> None:
    """``model.init_from``: weights that exist (what they hold is read when the run starts)."""
    if path is None:
        return
    if not path.strip():
        raise ConfigError("model.init_from", path, "empty", valid="a weights file or directory, or null")
    if not Path(path).expanduser().exists():
        raise ConfigError(
            "model.init_from", path, "no such file or directory",
            valid="a safetensors or .pt file, a save_pretrained folder, a checkpoint or run directory",
        )  # fmt: skip


def check_data(data: DataConfig) -> None:
    """The data group's own keys (whether its samples fit the model is the model spec's rule)."""
    _at_least("data.num_workers", data.num_workers, 0)
    if not data.target_key.strip():
        raise ConfigError(
            "data.target_key", data.target_key, "empty", valid="the key of the targets, e.g. labels"
        )
    if data.collate is not None and not (isinstance(data.collate, dict) and data.collate.get("_target_")):
        raise ConfigError(
            "data.collate", data.collate, "not a callable", valid="null, or a node with _target_ (fn(items))"
        )
    if data.target is not None:
        return  # the user's dataset: checked on a real item by hpctrain.submit.probe
    from hpctrain.config.catalog import DATASET_KINDS

    _one_of("data", data.name, tuple(DATASET_KINDS))
    if not 0.0 < data.val_fraction <= 0.5:
        raise ConfigError("data.val_fraction", data.val_fraction, "must be in (0, 0.5]")
    _at_least("data.num_samples", data.num_samples, 2)
    _at_least("data.max_bytes", data.max_bytes, 1024)


def data_facts(data: DataConfig) -> tuple[str, tuple[int, int, int, int] | None, int | None]:
    """What built-in dataset ``data`` yields: (kind, fixed image shape or None, vocabulary or None)."""
    from hpctrain.config.catalog import DATASET_KINDS, fixed_image_shape, fixed_vocab

    assert data.name is not None
    vocab = _token_file_vocab(data.path) if data.name == "tokens" else fixed_vocab(data.name)
    return DATASET_KINDS[data.name], fixed_image_shape(data.name), vocab


def _token_file_vocab(path: str | None) -> int:
    from hpctrain.config.catalog import read_token_header

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
    except (ValueError, OSError) as err:
        raise ConfigError("data.path", path, f"not a usable token file: {err}") from None


def _check_cluster(cfg: Config) -> None:
    c = cfg.cluster
    _one_of("cluster.kind", c.kind, CLUSTER_KINDS)
    _one_of("launcher", cfg.launcher, LAUNCHERS[c.kind])
    _at_least("cluster.dist_timeout_s", c.dist_timeout_s, 1)
    if c.kind == "local":
        _at_least("cluster.nproc", c.nproc, 1)
        check_local_cluster(c.nproc, c.master_addr)
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
        if value is not None and not SAFE_SLURM_TOKEN.fullmatch(value):
            raise ConfigError(
                f"cluster.{key}",
                value,
                "contains characters a shell or sbatch would act on",
                valid="letters, digits and _ . , : @ % + = [ ] -",
            )
    _check_sbatch_options(c)
    if c.constraint is not None and not SAFE_CONSTRAINT.fullmatch(c.constraint):
        raise ConfigError(
            "cluster.constraint",
            c.constraint,
            "not a Slurm feature expression",
            valid="features joined by & | , with [ ] ( ) *",
        )
    for name in c.env:
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(f"cluster.env.{name}", c.env[name], "not a valid environment variable name")
    for line in c.setup:
        try:
            shlex.split(line)
        except ValueError as err:
            raise ConfigError("cluster.setup", line, f"cannot be split into words: {err}") from None
    if c.container_image is not None and not SAFE_CONTAINER.fullmatch(c.container_image):
        raise ConfigError("cluster.container_image", c.container_image, "not an image reference or path")
    for mount in c.container_mounts:
        if not SAFE_MOUNT.fullmatch(mount):
            raise ConfigError("cluster.container_mounts", mount, "not a mount", valid="SRC:DST[:FLAGS]")
    for path in c.snapshot_paths:
        parts = path.replace("\\", "/").split("/")
        if (
            not path
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in path)
            or path.startswith(("/", "~"))
            or ".." in parts
        ):
            raise ConfigError(
                "cluster.snapshot_paths",
                path,
                "not a path inside the submit directory",
                valid="relative paths without .. or control characters, e.g. [mynets,conf]",
            )


def _check_parallel(cfg: Config) -> None:
    p = cfg.parallel
    _one_of("parallel", p.name, PARALLEL_STRATEGIES)
    if p.name == "none" and world_size(cfg) != 1:
        key = "cluster.nproc" if cfg.cluster.kind == "local" else "cluster.nodes"
        raise ConfigError(
            key,
            getattr(cfg.cluster, key.split(".")[1]),
            f"parallel=none runs one process, this gives {world_size(cfg)}",
            valid="a single process, or parallel=ddp",
        )
    d = degrees(cfg)
    dims = STRATEGY_DIMS[p.name]
    _at_least("parallel.bucket_cap_mb", p.bucket_cap_mb, 0.0)
    _one_of("parallel.compression", p.compression, COMPRESSIONS)
    _one_of("parallel.activation_checkpointing", p.activation_checkpointing, ACTIVATION_CHECKPOINTING)
    if p.compression != "none" and p.name != "ddp":
        raise ConfigError(
            "parallel.compression",
            p.compression,
            f"gradient compression hooks are DDP's; parallel={p.name} reduces gradients otherwise",
            valid="none, or parallel=ddp",
        )
    if not 0.0 < p.topk_ratio <= 1.0:
        raise ConfigError("parallel.topk_ratio", p.topk_ratio, "must be in (0, 1]")
    _at_least("parallel.powersgd_rank", p.powersgd_rank, 1)
    # torch's PowerSGD keeps error feedback from its first compressed step on, and needs ≥ 1 plain step first.
    _at_least("parallel.powersgd_start_step", p.powersgd_start_step, 2)
    if p.cpu_offload and "dp_shard" not in dims:
        raise ConfigError(
            "parallel.cpu_offload",
            p.cpu_offload,
            f"offload moves FSDP shards to host memory; parallel={p.name} has no FSDP",
            valid="parallel=fsdp, hsdp, 2d or 3d",
        )
    for pattern, role in p.tp_plan.items():
        key = f"parallel.tp_plan[{pattern}]"
        check_text(key, str(pattern))
        atoms = str(pattern).split(".")
        if not all(atom == "*" or atom.isidentifier() or atom.isdigit() for atom in atoms):
            raise ConfigError(
                "parallel.tp_plan",
                pattern,
                "not a module-name pattern",
                valid="dotted names, * for one level",
            )
        _one_of(key, role, TP_ROLES)
    _check_pp_split(p.pp_split)
    if d.pp > 1:
        _check_pipeline(cfg, d.pp)
    elif p.schedule not in PIPELINE_SCHEDULES:
        _one_of("parallel.schedule", p.schedule, tuple(PIPELINE_SCHEDULES))


def _check_sbatch_options(c: Any) -> None:
    """The sbatch options of their own keys and ``cluster.additional`` (any other one, by its long name)."""
    for key in ("gres", "reservation"):
        value = getattr(c, key)
        if value is not None and not SAFE_SLURM_TOKEN.fullmatch(value):
            raise ConfigError(f"cluster.{key}", value, "contains characters a shell or sbatch would act on",
                              valid="letters, digits and _ . , : @ % + = [ ] -")  # fmt: skip
    if c.gpus_per_task is not None:
        _at_least("cluster.gpus_per_task", c.gpus_per_task, 1)
    if c.mail_user is not None and not MAIL_USER.fullmatch(c.mail_user):
        raise ConfigError("cluster.mail_user", c.mail_user, "not an e-mail address", valid="user@host")
    if c.mail_type is not None:
        for kind in c.mail_type.split(","):
            _one_of("cluster.mail_type", kind, MAIL_TYPES)
    if c.dependency is not None and not DEPENDENCY.fullmatch(c.dependency):
        raise ConfigError("cluster.dependency", c.dependency, "not a Slurm dependency",
                          valid="e.g. afterok:1234, afterany:12:13, singleton")  # fmt: skip
    for name, value in c.additional.items():
        key = f"cluster.additional.{name}"
        if not SBATCH_OPTION.fullmatch(str(name)):
            raise ConfigError(
                key, value, "not an sbatch long option name", valid="e.g. comment, nice, licenses"
            )
        if str(name).replace("_", "-") in RESERVED_SBATCH:
            raise ConfigError(key, value, "hpctrain sets this option itself",
                              valid="its own key, e.g. cluster.exclusive, cluster.mail_type")  # fmt: skip
        if isinstance(value, bool) or value is None:
            continue  # a flag (true), or left out
        if not SAFE_SLURM_TOKEN.fullmatch(str(value)):
            raise ConfigError(key, value, "contains characters a shell or sbatch would act on",
                              valid="letters, digits and _ . , : @ % + = [ ] -")  # fmt: skip


def _check_pp_split(split: dict[str, Any]) -> None:
    """``parallel.pp_split``: ``{input: [names], blocks: NAME, output: [names]}``, module names only."""
    if not split:
        return
    for key in split:
        if key not in ("input", "blocks", "output"):
            raise ConfigError(
                f"parallel.pp_split.{key}", split[key], "unknown key", valid="input, blocks, output"
            )
    if not isinstance(split.get("blocks"), str) or not split["blocks"]:
        raise ConfigError(
            "parallel.pp_split.blocks", split.get("blocks"), "missing or not a module name",
            valid="the name of the model's nn.ModuleList of blocks, e.g. blocks or model.layers",
        )  # fmt: skip
    for key in ("input", "blocks", "output"):
        value = split.get(key) or []
        for name in [value] if isinstance(value, str) else value:
            if not isinstance(name, str) or not all(a.isidentifier() or a.isdigit() for a in name.split(".")):
                raise ConfigError(f"parallel.pp_split.{key}", name, "not a module name", valid="dotted names")


def _check_pipeline(cfg: Config, pp: int) -> None:
    p = cfg.parallel
    _one_of("parallel.schedule", p.schedule, tuple(PIPELINE_SCHEDULES))
    _at_least("parallel.microbatches", p.microbatches, 1)
    _at_least("parallel.stages_per_rank", p.stages_per_rank, 0)
    per_rank, needed = stages_per_rank(p), PIPELINE_SCHEDULES[p.schedule]
    if (needed == 1 and per_rank != 1) or (needed == 0 and per_rank < 2) or (needed == 2 and per_rank != 2):
        want = {1: "1", 0: "≥ 2", 2: "2"}[needed]
        raise ConfigError(
            "parallel.stages_per_rank", per_rank, f"parallel.schedule={p.schedule} runs {want} per rank"
        )
    if p.microbatches < pp:
        raise ConfigError(
            "parallel.microbatches",
            p.microbatches,
            f"fewer micro-batches than the parallel.pp={pp} stages leaves stages idle in every step",
            valid=f"≥ {pp}",
        )
    if per_rank > 1 and p.microbatches % pp:
        # torch's looped schedules run the micro-batches in rounds of pp.
        raise ConfigError(
            "parallel.microbatches",
            p.microbatches,
            f"parallel.schedule={p.schedule} runs micro-batches in rounds of parallel.pp={pp}",
            valid=f"a multiple of {pp}",
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
        # Sizes and the manifest here; each file's checksum is verified by the worker as it loads it.
        problem = checkpoint_layout.problem_with(Path(t.resume), checksums=False)
        if problem:
            raise ConfigError(
                "trainer.resume",
                t.resume,
                f"not a loadable checkpoint: {problem}",
                valid="auto, never, or a committed checkpoints/step_* directory",
            )
    for key in ("watchdog_factor", "watchdog_min_s"):
        _at_least(f"trainer.{key}", getattr(t, key), 0.0)
    _at_least("trainer.straggler_every", t.straggler_every, 0)
    if t.profile is not None:
        first, _, last = t.profile.partition(":")
        if not (first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last) <= t.max_steps):
            raise ConfigError(
                "trainer.profile",
                t.profile,
                f"expected FIRST:LAST, steps with 1 ≤ FIRST ≤ LAST ≤ trainer.max_steps={t.max_steps}",
                valid="e.g. 10:12",
            )


WRITER_FAILURE = ("warn", "stop")


def _check_checkpoint(cfg: Config) -> None:
    """The fast tier: an interval ≥ 1 (or none), an absolute node-local path (for a local run, one this
    machine can write; a Slurm node's is checked by the job, with the state's size)."""
    c = cfg.checkpoint
    _one_of("checkpoint.on_writer_failure", c.on_writer_failure, WRITER_FAILURE)
    given = os.environ.get(checkpoint_layout.JOB_ID_ENV)
    if given is not None and not checkpoint_layout.valid_job_id(given):
        raise ConfigError(checkpoint_layout.JOB_ID_ENV, given, "not a job id",
                          valid="1-64 characters of A-Z a-z 0-9 . _ -")  # fmt: skip
    if c.local_every is None:
        return
    if c.local_every < 1:
        raise ConfigError(
            "checkpoint.local_every", c.local_every, "must be ≥ 1 (steps between fast-tier copies)",
            valid="e.g. 10, or null to keep no fast tier",
        )  # fmt: skip
    if cfg.task.name != "train":
        raise ConfigError(
            "checkpoint.local_every",
            c.local_every,
            f"the fast tier is hpctrain's trainer's, not task={cfg.task.name}'s",
            valid="null with task=script",
        )
    path = Path(c.local_path)
    if not c.local_path or not path.is_absolute():
        raise ConfigError(
            "checkpoint.local_path", c.local_path, "must be an absolute path (a node-local directory)",
            valid="e.g. /dev/shm",
        )  # fmt: skip
    if cfg.cluster.kind == "local":
        valid = "an existing writable node-local directory, e.g. /dev/shm"
        if not path.is_dir():
            raise ConfigError("checkpoint.local_path", c.local_path, "is not a directory here", valid=valid)
        try:
            Path(tempfile.mkdtemp(prefix=".hpctrain-probe-", dir=path)).rmdir()
        except OSError as err:
            reason = f"not writable: {err.strerror or err}"
            raise ConfigError("checkpoint.local_path", c.local_path, reason, valid=valid) from None


def _check_logger(cfg: Config) -> None:
    _one_of("logger.wandb_mode", cfg.logger.wandb_mode, WANDB_MODES)


def _check_batch(cfg: Config) -> None:
    t, d = cfg.trainer, degrees(cfg)
    per_pass = samples_per_pass(cfg)
    if t.global_batch_size is not None and t.global_batch_size % per_pass:
        lower = max(per_pass, t.global_batch_size // per_pass * per_pass)
        factors = f"{t.micro_batch_size} × {d.dp}"
        names = "micro_batch_size × data-parallel size"
        if d.pp > 1:
            factors += f" × {cfg.parallel.microbatches}"
            names += " × parallel.microbatches"
        raise ConfigError(
            "trainer.global_batch_size",
            t.global_batch_size,
            f"must be a multiple of {names} = {factors} = {per_pass}",
            valid=f"e.g. {lower} or {lower + per_pass}",
        )
