"""Other layouts of the same run that fit, fastest first. Torch-free (it runs before every submission that
does not fit, to say what would).

What stays: the model, the world size (cluster), the samples per optimizer step (the global batch), the
precision and the optimizer. What changes: the split of the ranks into pipeline × data-parallel × tensor
parallel (every strategy and degree the world size allows), activation checkpointing, pipeline
micro-batches, and the micro-batch size (gradient accumulation makes up the global batch). Two more axes,
where the model has them and only where they can matter, so the search of a dense model of short sequences
costs what it did: a mixture of experts also tries expert parallelism over the FSDP ranks (``parallel.ep``:
each rank gathers only its experts' weights); a layout whose one-sample micro-batch does not fit (its
activations: one sequence's are too many) tries context parallelism (``parallel.cp``: each rank keeps
1/cp of every sequence), the smallest degree that fits. Tied embeddings
stay tied under pipeline layouts: the last stage holds a copy of the embedding for its LM head (Megatron's
embedding group), which the memory estimate counts.

:func:`smallest_fit` searches the other way, for a run whose GPUs are far more than its model needs: the
fewest ranks of the same profile on which a layout of the same global batch fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.config.shape import EXTRA_DIMS, PIPELINE_SCHEDULES, STRATEGY_DIMS, Degrees, run_shape
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import ModelFacts
from hpctrain.plan.check import check_run
from hpctrain.plan.estimate import Estimate, estimate

AC_MODES = ("none", "selective", "full")
# Pipeline micro-batches per pass tried, as multiples of the pipeline degree (more: smaller bubble, more
# activation memory under GPipe, more receive buffers).
MICROBATCH_FACTORS = (1, 2, 4, 8)
# The degree left open (derived from the world size) in the printed overrides, per strategy.
DERIVED = {"hsdp": "dp_replicate", "2d": "dp_shard", "3d": "dp_shard"}
_DEGREE_KEYS = {f"parallel.{dim}" for dim in ("pp", "dp_replicate", "dp_shard", "tp", "ep", "cp")}
# The strategies whose dp_shard is derived and that take ep and cp beside (config.shape.TAKES_EXTRA).
WITH_EXTRA = ("fsdp", "2d", "3d")
# Below this much compute per GPU and step, the step's fixed costs dominate it: a kernel launch costs ~5 µs
# and a transformer step launches hundreds to thousands of them; each collective's latency over NVLink or
# InfiniBand is tens of µs, several per step; the optimizer's pass over every tensor. More GPUs then only
# add communication: the run's GPUs are far more than its model needs.
MIN_RANK_COMPUTE_S = 0.01


@dataclass(frozen=True)
class Alternative:
    overrides: tuple[str, ...]  # what to add to (or change in) the command line
    cfg: Config
    estimate: Estimate


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _layouts(world: int) -> Iterator[tuple[str, dict[str, int]]]:
    """(strategy, degrees) for every way the strategies split ``world`` ranks."""
    if world == 1:
        yield "none", {}
        return
    yield "ddp", {"dp_replicate": world}
    yield "fsdp", {"dp_shard": world}
    yield "tp", {"tp": world}
    yield "pp", {"pp": world}
    for k in _divisors(world)[1:-1]:
        yield "hsdp", {"dp_replicate": world // k, "dp_shard": k}
        yield "2d", {"dp_shard": world // k, "tp": k}
    for pp in _divisors(world)[1:]:
        for tp in _divisors(world // pp)[1:]:
            yield "3d", {"pp": pp, "dp_shard": world // (pp * tp), "tp": tp}


def _splits_model(
    cfg: Config, tp: int, pp: int, per_rank: int, measured: ModelFacts | None = None, ep: int = 1, cp: int = 1
) -> bool:
    """The model's own layout rules (its spec's ``check_layout``) for these degrees, checked cheaply first;
    with sequence parallelism, positions that split evenly. A measured model (a user's: its facts hold the
    split of the run's own layout) splits over data-parallel ranks only."""
    if measured is not None:
        return tp == 1 and pp == 1 and ep == 1 and cp == 1
    spec = model_spec(cfg.model)
    if tp > 1 and cfg.parallel.sequence_parallel and spec.tokens_per_sample % tp:
        return False
    try:
        spec.check_layout(Degrees(pp=pp, tp=tp, ep=ep, cp=cp), cfg.parallel, pp * per_rank)
    except ConfigError:
        return False
    return True


def _experts(cfg: Config, measured: ModelFacts | None) -> int:
    """Experts of the model's mixture-of-experts layers (0: dense, or a measured model: planned as given)."""
    return 0 if measured is not None else getattr(model_spec(cfg.model), "experts", 0)


def _candidates(cfg: Config, measured: ModelFacts | None = None) -> Iterator[Config]:
    p, t = cfg.parallel, cfg.trainer
    # A measured model: full checkpointing where blocks were found to wrap (selective is not measured).
    ac_modes = AC_MODES if measured is None else ("none", "full")[: 1 + bool(measured.blocks)]
    shape = run_shape(cfg)
    world, batch = shape.world_size, shape.global_batch_size
    # Keep the user's schedule when it pipelines already; otherwise 1F1B, which needs one stage per rank.
    schedule = p.schedule if p.name in ("pp", "3d") else "1f1b"
    per_rank = PIPELINE_SCHEDULES[schedule] or 2
    experts = _experts(cfg, measured)
    for name, dims in _expert_layouts(_layouts(world), experts):
        pp, tp, ep = dims.get("pp", 1), dims.get("tp", 1), dims.get("ep", 1)
        # Expert-parallel ranks train different samples: data parallel (Degrees.dp).
        dp = dims.get("dp_replicate", 1) * dims.get("dp_shard", 1) * ep
        if not _splits_model(cfg, tp, pp, per_rank if pp > 1 else 1, measured, ep=ep):
            continue
        sharded = dims.get("dp_shard", 1) > 1
        degrees = {
            d: (0 if DERIVED.get(name) == d else dims.get(d, 0))
            for d in ("pp", "dp_replicate", "dp_shard", "tp")
        }
        if name in ("ddp", "fsdp", "tp", "pp"):
            degrees = dict.fromkeys(degrees, 0)
        reshards = (True, False) if name == "fsdp" else (p.reshard_after_forward,)
        for ac in ac_modes:
            for reshard in reshards:
                for factor in MICROBATCH_FACTORS if pp > 1 else (1,):
                    m = pp * factor if pp > 1 else p.microbatches
                    if pp > 1 and per_rank > 1 and m % pp:
                        continue
                    # Context parallelism: tried by ``alternatives`` where a sample does not fit.
                    parallel = dataclasses.replace(
                        p,
                        name=name,
                        **degrees,
                        cp=0,
                        ep=ep if ep > 1 else 0,
                        activation_checkpointing=ac,
                        reshard_after_forward=reshard,
                        cpu_offload=p.cpu_offload and sharded,
                        compression=p.compression if name == "ddp" else "none",
                        schedule=schedule if pp > 1 else p.schedule,
                        microbatches=m,
                        stages_per_rank=0,
                    )
                    per_pass = dp * (m if pp > 1 else 1)
                    if batch % per_pass:
                        continue
                    # The largest micro-batch that fits is the fastest here (fewer passes, fewer FSDP
                    # gathers): yield them largest first, the caller keeps the first that fits.
                    for size in sorted(_divisors(batch // per_pass), reverse=True):
                        trainer = dataclasses.replace(t, micro_batch_size=size, global_batch_size=batch)
                        yield dataclasses.replace(cfg, parallel=parallel, trainer=trainer)


def _expert_layouts(
    layouts: Iterator[tuple[str, dict[str, int]]], experts: int
) -> Iterator[tuple[str, dict[str, int]]]:
    """``layouts``, and for a mixture of ``experts`` each sharded one again with expert parallelism: the
    largest degree that divides both its FSDP ranks and the experts (each rank then gathers the fewest
    experts' weights; dp_shard is what ep leaves). One degree, not every one: the search of a mixture of
    experts costs at most twice a dense one's."""
    for name, dims in layouts:
        yield name, dims
        shard = dims.get("dp_shard", 1)
        if not experts or name not in WITH_EXTRA:
            continue
        ep = max(k for k in _divisors(shard) if experts % k == 0)
        if ep > 1:
            yield name, {**dims, "dp_shard": shard // ep, "ep": ep}


def _with_context(cfg: Config, measured: ModelFacts | None) -> Iterator[Config]:
    """``cfg`` (a layout whose one-sample micro-batch does not fit) with context parallelism over its FSDP
    ranks (which keep their shards: dp_shard × cp): the smallest degree whose one-sample micro-batch fits,
    then its micro-batch sizes largest first (one estimate per degree tried, not one per size)."""
    p = cfg.parallel
    if measured is not None or p.name not in WITH_EXTRA or p.cp > 1:
        return
    shape = run_shape(cfg)
    d, batch = shape.degrees, shape.global_batch_size
    per_rank = shape.stages_per_rank if d.pp > 1 else 1
    for cp in _divisors(d.dp_shard)[1:]:
        parallel = dataclasses.replace(p, cp=cp)
        one = dataclasses.replace(
            cfg, parallel=parallel, trainer=dataclasses.replace(cfg.trainer, micro_batch_size=1)
        )
        per_pass = run_shape(one).samples_per_pass  # one sample per data-parallel rank and micro-batch
        if batch % per_pass or not _splits_model(cfg, d.tp, d.pp, per_rank, measured, ep=d.ep, cp=cp):
            continue
        sized = [
            dataclasses.replace(
                cfg,
                parallel=parallel,
                trainer=dataclasses.replace(cfg.trainer, micro_batch_size=size, global_batch_size=batch),
            )
            for size in sorted(_divisors(batch // per_pass), reverse=True)
        ]
        if estimate(sized[-1], measured).verdict.fits:
            yield from sized
            return


def overrides_for(original: Config, cfg: Config) -> tuple[str, ...]:
    """The command-line overrides that turn ``original`` into ``cfg`` (for the knobs the search changes)."""
    p, q = original.parallel, cfg.parallel
    out = [f"parallel={q.name}"]
    for dim in STRATEGY_DIMS[q.name]:
        if getattr(q, dim):
            out.append(f"parallel.{dim}={getattr(q, dim)}")
    for dim in EXTRA_DIMS:
        if dim not in STRATEGY_DIMS[q.name] and (getattr(q, dim) > 1 or getattr(p, dim) > 1):
            out.append(f"parallel.{dim}={max(getattr(q, dim), 1)}")
    for key in ("activation_checkpointing", "reshard_after_forward", "cpu_offload", "compression"):
        if getattr(q, key) != getattr(p, key):
            out.append(f"parallel.{key}={str(getattr(q, key)).lower()}")
    if "pp" in STRATEGY_DIMS[q.name]:
        for key in ("schedule", "microbatches", "stages_per_rank"):
            if getattr(q, key) != getattr(p, key):
                out.append(f"parallel.{key}={getattr(q, key)}")
    if cfg.trainer.micro_batch_size != original.trainer.micro_batch_size:
        out.append(f"trainer.micro_batch_size={cfg.trainer.micro_batch_size}")
    shape = run_shape(cfg)
    if shape.samples_per_pass != shape.global_batch_size and original.trainer.global_batch_size is None:
        out.append(f"trainer.global_batch_size={cfg.trainer.global_batch_size}")
    return tuple(out)


def _settle(
    cfg: Config,
    candidates: Iterator[Config],
    measured: ModelFacts | None,
    current: tuple[str, ...],
    settled: set[tuple[str, ...]],
    found: dict[tuple[str, ...], Estimate],
    configs: dict[tuple[str, ...], Config],
) -> None:
    """The first of ``candidates`` (one layout family, best first) that fits, recorded as ``alternatives``
    records its own."""
    for candidate in candidates:
        layout = overrides_for(cfg, dataclasses.replace(candidate, trainer=cfg.trainer))
        if layout in settled:
            return
        est = estimate(candidate, measured)
        if est.verdict.fits:
            settled.add(layout)
            if overrides_for(cfg, candidate) != current:
                found[layout], configs[layout] = est, candidate
            return


def _rank_key(est: Estimate) -> tuple[float, int]:
    step = est.time.step_s if est.time is not None else 0.0
    return step, est.largest.total


def alternatives(
    cfg: Config, limit: int = 3, measured: ModelFacts | None = None, keep_current: bool = False
) -> list[Alternative]:
    """Up to ``limit`` layouts that fit, fastest first (least memory first when the step time is unknown):
    for each split of the ranks (strategy and degrees) its fastest variant (checkpointing, pipeline
    micro-batches, the largest micro-batch size that fits). ``measured``: the facts of a model without
    declared shapes (see ``estimate``). ``keep_current``: the config's own layout may be among them."""
    found: dict[tuple[str, ...], Estimate] = {}
    configs: dict[tuple[str, ...], Config] = {}
    settled: set[tuple[str, ...]] = set()  # layouts whose best micro-batch size is known
    current = overrides_for(cfg, cfg)
    for candidate in _candidates(cfg, measured):
        layout = overrides_for(cfg, dataclasses.replace(candidate, trainer=cfg.trainer))
        if layout in settled:
            continue
        est = estimate(candidate, measured)
        if not est.verdict.fits:
            # Not one sample, and its activations are what does not fit: split the sequences.
            short = est.verdict.need - est.verdict.usable
            if candidate.trainer.micro_batch_size == 1 and est.largest.activations > short:
                _settle(cfg, _with_context(candidate, measured), measured, current, settled, found, configs)
            continue
        settled.add(layout)  # smaller micro-batches of it are no faster
        if keep_current or overrides_for(cfg, candidate) != current:  # the config itself is no alternative
            found[layout], configs[layout] = est, candidate
    ranked = sorted(found, key=lambda k: _rank_key(found[k]))
    out: list[Alternative] = []
    families: set[tuple[str, ...]] = set()  # one entry per split of the ranks: its fastest variant
    for layout in ranked:
        candidate = configs[layout]
        family = tuple(o for o in layout if o.startswith("parallel=") or o.split("=")[0] in _DEGREE_KEYS)
        if family in families:
            continue
        try:
            check_run(candidate)
        except ConfigError:
            continue
        families.add(family)
        out.append(Alternative(overrides_for(cfg, candidate), candidate, found[layout]))
        if len(out) == limit:
            break
    return out


@dataclass(frozen=True)
class SmallerFit:
    """The fewest ranks of a run's profile on which its model fits, and the fastest layout there."""

    ranks: int
    cluster: tuple[str, ...]  # the cluster overrides that give those ranks
    layout: Alternative  # its overrides relative to the run's own config


def _fewer_ranks(c: ClusterConfig, world: int) -> Iterator[tuple[int, ClusterConfig, tuple[str, ...]]]:
    """(ranks, cluster, overrides) for fewer ranks of the same profile, fewest first: one process here, or
    on a Slurm profile part of one node (powers of two), then whole nodes."""
    if c.kind == "local":
        for k in range(1, min(world, c.nproc)):
            yield k, dataclasses.replace(c, nproc=k), (f"cluster.nproc={k}",)
        return
    per_node = c.tasks_per_node
    one_node = () if c.nodes == 1 else ("cluster.nodes=1",)
    part = sorted({2**i for i in range(per_node.bit_length()) if 2**i < per_node} | {per_node})
    for k in part:
        if k >= world:
            return
        # One GPU per task where the profile has as many (else its GPUs per node stay as they are).
        gpus = k if c.gpus_per_node == per_node else c.gpus_per_node
        words = (*one_node, f"cluster.tasks_per_node={k}")
        words += (f"cluster.gpus_per_node={k}",) if gpus != c.gpus_per_node else ()
        yield k, dataclasses.replace(c, nodes=1, tasks_per_node=k, gpus_per_node=gpus), words
    for n in range(2, c.nodes):
        yield n * per_node, dataclasses.replace(c, nodes=n), (f"cluster.nodes={n}",)


def smallest_fit(cfg: Config, est: Estimate, measured: ModelFacts | None = None) -> SmallerFit | None:
    """For a run on GPUs whose every rank computes less than :data:`MIN_RANK_COMPUTE_S` per step (the
    estimate's ``compute_s``): the fewest ranks of the same profile on which a layout of the same global
    batch fits, with its fastest layout. None when the run is not that far too large, its step time is
    unknown, it is no trainer run (a script's model is not the one planned), or no fewer ranks fit."""
    t = est.time
    if cfg.task.name != "train" or est.verdict.kind != "gpu" or t is None or est.world <= 1:
        return None
    if t.compute_s >= MIN_RANK_COMPUTE_S:
        return None
    batch = est.layout.shape.global_batch_size
    trainer = dataclasses.replace(cfg.trainer, global_batch_size=batch)
    for ranks, cluster, words in _fewer_ranks(cfg.cluster, est.world):
        # A start the search can move from on any number of ranks: one process, or plain data parallelism.
        parallel = dataclasses.replace(
            cfg.parallel,
            name="none" if ranks == 1 else "ddp",
            **dict.fromkeys(("pp", "dp_replicate", "dp_shard", "tp", "cp", "ep", "stages_per_rank"), 0),
        )
        fewer = dataclasses.replace(cfg, cluster=cluster, parallel=parallel, trainer=trainer)
        try:
            found = alternatives(fewer, limit=1, measured=measured, keep_current=True)
        except ConfigError:  # the global batch does not split over these ranks
            continue
        if found:
            best = found[0]
            layout = Alternative(overrides_for(cfg, best.cfg), best.cfg, best.estimate)
            return SmallerFit(ranks, words, layout)
    return None
