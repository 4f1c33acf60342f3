"""The parallel group's rules: the strategy, its degrees against the world size, compression, offload, the
tensor-parallel plan's patterns, the pipeline's split and schedule. Torch-free."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.config.sanity import at_least, check_text, check_writable_dir, one_of
from hpctrain.config.schema import TP_ROLES, Config
from hpctrain.config.shape import PIPELINE_SCHEDULES, STRATEGY_DIMS, degrees, stages_per_rank, world_size
from hpctrain.errors import ConfigError

PARALLEL_STRATEGIES = tuple(STRATEGY_DIMS)
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")
ACTIVATION_CHECKPOINTING = ("none", "full", "selective")


def check_parallel(cfg: Config) -> None:
    """The parallel group: a known strategy whose degrees fit the world size, and its options."""
    p = cfg.parallel
    one_of("parallel", p.name, PARALLEL_STRATEGIES)
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
    at_least("parallel.bucket_cap_mb", p.bucket_cap_mb, 0.0)
    one_of("parallel.compression", p.compression, COMPRESSIONS)
    one_of("parallel.activation_checkpointing", p.activation_checkpointing, ACTIVATION_CHECKPOINTING)
    if p.compression != "none" and p.name != "ddp":
        raise ConfigError(
            "parallel.compression",
            p.compression,
            f"gradient compression hooks are DDP's; parallel={p.name} reduces gradients otherwise",
            valid="none, or parallel=ddp",
        )
    if not 0.0 < p.topk_ratio <= 1.0:
        raise ConfigError("parallel.topk_ratio", p.topk_ratio, "must be in (0, 1]")
    at_least("parallel.powersgd_rank", p.powersgd_rank, 1)
    # torch's PowerSGD keeps error feedback from its first compressed step on, and needs ≥ 1 plain step first.
    at_least("parallel.powersgd_start_step", p.powersgd_start_step, 2)
    if p.cpu_offload and "dp_shard" not in dims and d.fsdp == 1:
        raise ConfigError(
            "parallel.cpu_offload",
            p.cpu_offload,
            f"offload moves FSDP shards to host memory; parallel={p.name} has no FSDP",
            valid="parallel=fsdp, hsdp, 2d, 3d, 4d or cp",
        )
    _check_context_and_experts(cfg, d.cp, d.ep)
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
        one_of(key, role, TP_ROLES)
    _check_compile_cache(p.compile_cache)
    if cfg.trainer.precision == "fp8" and d.tp > 1:
        # torchao's float8 layers need their own tensor-parallel styles (Float8ColwiseParallel, ...), which
        # hpctrain's plans do not apply.
        raise ConfigError(
            "trainer.precision",
            "fp8",
            f"float8 layers do not split under parallel.tp={d.tp}",
            valid="bf16 with tensor parallelism, or fp8 with ddp, fsdp, hsdp, pp or none",
        )
    _check_pp_split(p.pp_split)
    if d.pp > 1:
        _check_pipeline(cfg, d.pp)
    elif p.schedule not in PIPELINE_SCHEDULES:
        one_of("parallel.schedule", p.schedule, tuple(PIPELINE_SCHEDULES))


MODEL_LOSS = "hpctrain.train.loss.model_loss"


def _check_context_and_experts(cfg: Config, cp: int, ep: int) -> None:
    """What context and expert parallelism do not take (the model's own rules are its spec's)."""
    p = cfg.parallel
    if cp > 1 and cfg.loss.target == MODEL_LOSS:
        # transformers' own loss shifts the labels by one inside the model: on a rank's share of the
        # sequence, the position before each chunk boundary would lose its target.
        raise ConfigError(
            "loss",
            "model",
            f"under parallel.cp={cp} each rank holds a share of the sequence, and a model's "
            "own loss shifts its labels across the shares' boundaries",
            valid="loss=cross_entropy with targets already shifted (the built-in data give them so)",
        )
    for key, degree in (("cp", cp), ("ep", ep)):
        if degree > 1 and p.compile:
            raise ConfigError(
                "parallel.compile",
                True,
                f"torch.compile does not trace the collectives parallel.{key}="
                f"{degree} runs inside the blocks (ring attention, all-to-all)",
                valid=f"parallel.compile=false with parallel.{key}",
            )


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
            "parallel.pp_split.blocks",
            split.get("blocks"),
            "missing or not a module name",
            valid="the name of the model's nn.ModuleList of blocks, e.g. blocks or model.layers",
        )
    for key in ("input", "blocks", "output"):
        value = split.get(key) or []
        for name in [value] if isinstance(value, str) else value:
            if not isinstance(name, str) or not all(a.isidentifier() or a.isdigit() for a in name.split(".")):
                raise ConfigError(f"parallel.pp_split.{key}", name, "not a module name", valid="dotted names")


def _check_pipeline(cfg: Config, pp: int) -> None:
    p = cfg.parallel
    one_of("parallel.schedule", p.schedule, tuple(PIPELINE_SCHEDULES))
    at_least("parallel.microbatches", p.microbatches, 1)
    at_least("parallel.stages_per_rank", p.stages_per_rank, 0)
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


COMPILE_CACHE_WORDS = ("run", "off")
COMPILE_CACHE_VALID = (
    "run (RUN_DIR/compile_cache), off (torch's default in /tmp), or an absolute path every node sees"
)


def _check_compile_cache(value: str) -> None:
    """``parallel.compile_cache``: run, off, or an absolute directory this machine can create and write (a
    shared cache must be seen alike by the submitting machine and every node: a relative path would be
    resolved against each process's own working directory)."""
    if value in COMPILE_CACHE_WORDS:
        return
    check_text("parallel.compile_cache", value)
    if not value.strip():
        raise ConfigError("parallel.compile_cache", value, "empty", valid=COMPILE_CACHE_VALID)
    path = Path(value)
    if not path.is_absolute() or ".." in path.parts:
        raise ConfigError(
            "parallel.compile_cache", value, "not an absolute path without ..", valid=COMPILE_CACHE_VALID
        )
    check_writable_dir("parallel.compile_cache", path)
