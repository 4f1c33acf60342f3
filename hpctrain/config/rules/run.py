"""The rules of what a run does: its task, its data keys, its starting weights and adapters, the optimizer,
the trainer (steps, batch, precision, resume, profiling), the logger, and whether the global batch splits
over the layout. Torch-free."""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.sanity import at_least, one_of
from hpctrain.config.schema import ADAPTERS, Config, DataConfig, ModelConfig, OptimConfig
from hpctrain.config.shape import degrees, samples_per_pass
from hpctrain.errors import ConfigError, require_package
from hpctrain.precision import PRECISIONS
from hpctrain.rundir import checkpoints as checkpoint_layout

OPTIMIZERS = ("adamw", "sgd")
WANDB_MODES = ("offline", "online", "disabled")
TASKS = ("train", "script")
SCRIPT_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2")


def check_task(cfg: Config) -> None:
    """``task=script``: a file that exists here (the job runs a snapshot of it), and a signal to forward."""
    t = cfg.task
    one_of("task", t.name, TASKS)
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
        raise ConfigError(
            "task.path",
            t.path,
            "not inside this folder (the job runs a snapshot of it)",
            valid="a relative path without ..",
        )
    one_of("task.signal", t.signal, SCRIPT_SIGNALS)
    if cfg.cluster.kind == "slurm" and t.signal == cfg.cluster.signal:
        raise ConfigError(
            "task.signal",
            t.signal,
            "is cluster.signal itself: the script would get it twice",
            valid=", ".join(s for s in SCRIPT_SIGNALS if s != cfg.cluster.signal),
        )


def check_init_from_exists(path: str | None) -> None:
    """``model.init_from``: weights that exist (what they hold is read when the run starts)."""
    if path is None:
        return
    if not path.strip():
        raise ConfigError("model.init_from", path, "empty", valid="a weights file or directory, or null")
    if not Path(path).expanduser().exists():
        raise ConfigError(
            "model.init_from",
            path,
            "no such file or directory",
            valid="a safetensors or .pt file, a save_pretrained folder, a checkpoint or run directory",
        )


def check_adapters(model: ModelConfig) -> None:
    """``model.adapters`` and ``model.lora``: a known kind, a rank ≥ 1, alpha > 0, dropout in [0, 1) and
    module-name patterns (whether they name a module of the model is checked when it is built)."""
    one_of("model.adapters", model.adapters, ADAPTERS)
    lora = model.lora
    at_least("model.lora.rank", lora.rank, 1)
    if not lora.alpha > 0:
        raise ConfigError(
            "model.lora.alpha", lora.alpha, "must be > 0", valid="e.g. 16 (the scale is alpha / rank)"
        )
    if not 0.0 <= lora.dropout < 1.0:
        raise ConfigError("model.lora.dropout", lora.dropout, "must be in [0, 1)")
    for i, pattern in enumerate(lora.targets):
        atoms = pattern.split(".")
        if not pattern.strip() or not all(a == "*" or a.isidentifier() or a.isdigit() for a in atoms):
            raise ConfigError(
                f"model.lora.targets[{i}]",
                pattern,
                "not a module-name pattern",
                valid="dotted names, * for one level, e.g. attn.q or layers.*.mlp.fc_in",
            )


def check_data_common(data: DataConfig) -> None:
    """The data group's keys common to every dataset (a built-in dataset's own: hpctrain.data.catalog; whether
    it feeds the model: the model spec's rule)."""
    at_least("data.num_workers", data.num_workers, 0)
    if not data.target_key.strip():
        raise ConfigError(
            "data.target_key", data.target_key, "empty", valid="the key of the targets, e.g. labels"
        )
    if data.collate is not None and not (isinstance(data.collate, dict) and data.collate.get("_target_")):
        raise ConfigError(
            "data.collate", data.collate, "not a callable", valid="null, or a node with _target_ (fn(items))"
        )


DEFAULT_WARMUP_STEPS = OptimConfig.warmup_steps
MAX_LR = 10.0  # SGD on a normalised model may use lr 1-5; nothing trains at 100


def check_optim(cfg: Config) -> None:
    optim = cfg.optim
    one_of("optim", optim.name, OPTIMIZERS)
    if not 0 < optim.lr <= MAX_LR:  # 1e30 is a typo, not a learning rate: it would train to NaN at once
        raise ConfigError("optim.lr", optim.lr, f"must be > 0 and at most {MAX_LR:g}", valid="e.g. 3e-4")
    at_least("optim.weight_decay", optim.weight_decay, 0.0)
    at_least("optim.warmup_steps", optim.warmup_steps, 0)
    steps = cfg.trainer.max_steps
    # A warmup longer than the run trains at a fraction of optim.lr throughout, without a word. The
    # default's few steps are left alone: a smoke run of 2-5 steps tries a setup, not a learning rate.
    if optim.warmup_steps > max(steps, DEFAULT_WARMUP_STEPS):
        raise ConfigError(
            "optim.warmup_steps",
            optim.warmup_steps,
            f"longer than the run (trainer.max_steps={steps}): it would never reach optim.lr",
            valid=f"0 to {steps} (trainer.max_steps), or a larger trainer.max_steps",
        )
    at_least("optim.grad_clip", optim.grad_clip, 0.0)
    if not 0.0 <= optim.min_lr_ratio <= 1.0:
        raise ConfigError("optim.min_lr_ratio", optim.min_lr_ratio, "must be in [0, 1]")
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(optim, key) < 1.0:
            raise ConfigError(f"optim.{key}", getattr(optim, key), "must be in [0, 1)")
    if not optim.eps > 0:  # Adam divides by sqrt(v) + eps: 0 divides by zero where a gradient is 0
        raise ConfigError("optim.eps", optim.eps, "must be > 0", valid="e.g. 1e-8")
    if optim.name == "sgd":
        # momentum ≥ 1 makes the velocity grow without bound (Sutskever et al. 2013, eq. 1: v ← μv - ε∇f);
        # torch.optim.SGD refuses a negative one, and Nesterov without momentum, deep in the workers.
        if not 0.0 <= optim.momentum < 1.0:
            raise ConfigError("optim.momentum", optim.momentum, "must be in [0, 1)", valid="e.g. 0.9")
        if optim.nesterov and optim.momentum == 0:
            raise ConfigError(
                "optim.nesterov", True, "Nesterov momentum needs momentum", valid="optim.momentum in (0, 1)"
            )
    if optim.fused and optim.name != "adamw":
        raise ConfigError(
            "optim.fused",
            optim.fused,
            f"the fused kernel is AdamW's; optim={optim.name} has none",
            valid="false, or optim=adamw",
        )


def check_trainer(cfg: Config) -> None:
    t = cfg.trainer
    if t.global_batch_size is not None:
        at_least("trainer.global_batch_size", t.global_batch_size, 1)
    for key in (
        "max_steps",
        "micro_batch_size",
        "keep_last",
        "eval_batches",
    ):
        at_least(f"trainer.{key}", getattr(t, key), 1)
    if t.log_every is not None:
        at_least("trainer.log_every", t.log_every, 1)
    if not 0 <= t.seed < 2**32:  # numpy.random.seed's range (checkpoint.state.seed_everything seeds it)
        raise ConfigError("trainer.seed", t.seed, "out of range", valid="0 to 4294967295 (2^32 - 1)")
    if t.ckpt_every != "auto" and (isinstance(t.ckpt_every, bool) or not isinstance(t.ckpt_every, int)):
        raise ConfigError(
            "trainer.ckpt_every", t.ckpt_every, "not a number of steps", valid="an integer ≥ 0, or auto"
        )
    for key in ("ckpt_every", "eval_every"):
        if getattr(t, key) != "auto":
            at_least(f"trainer.{key}", getattr(t, key), 0)
    if not cfg.cluster.mtbf_h > 0:
        raise ConfigError("cluster.mtbf_h", cfg.cluster.mtbf_h, "must be > 0", valid="hours, e.g. 24")
    one_of("trainer.precision", t.precision, PRECISIONS)
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
        at_least(f"trainer.{key}", getattr(t, key), 0.0)
    at_least("trainer.straggler_every", t.straggler_every, 0)
    if t.memory_history and cfg.cluster.kind == "slurm" and cfg.cluster.gpus_per_node == 0:
        raise ConfigError(
            "trainer.memory_history",
            t.memory_history,
            "the CUDA allocator's history needs a GPU, and cluster.gpus_per_node=0",
            valid="null (armed after an out-of-memory on a GPU), false, or true with GPUs",
        )
    one_of("trainer.nonfinite", t.nonfinite, NONFINITE)
    at_least("trainer.max_nonfinite_skips", t.max_nonfinite_skips, 0)
    if t.profile is not None:
        first, _, last = t.profile.partition(":")
        if not (first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last) <= t.max_steps):
            raise ConfigError(
                "trainer.profile",
                t.profile,
                f"expected FIRST:LAST, steps with 1 ≤ FIRST ≤ LAST ≤ trainer.max_steps={t.max_steps}",
                valid="e.g. 10:12",
            )


NONFINITE = ("skip", "rollback", "stop")


def check_logger(cfg: Config) -> None:
    one_of("logger.wandb_mode", cfg.logger.wandb_mode, WANDB_MODES)
    # Found before anything starts, not by every rank after the workers joined (find_spec imports nothing).
    if cfg.logger.tensorboard:
        require_package("logger", "tensorboard", "tensorboard")
    if cfg.logger.wandb and cfg.logger.wandb_mode != "disabled":
        require_package("logger", "wandb", "wandb")


def check_batch(cfg: Config) -> None:
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
