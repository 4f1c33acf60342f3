"""What ``hpctrain plan … --rehearse`` leaves for the commands after it: a record per rehearsed plan.

The rehearsal (:mod:`hpctrain.task.rehearse`) runs every distinct rank's start-up on this machine. Its
outcome is kept under a fingerprint of what shapes a rank's start-up (the model, the layout, the world,
the batch, precision and optimizer), so that

- a dry run of the same plan says whether it was rehearsed, and if not, how to (:func:`rehearsal_line`);
- ``rehearse=true`` rehearses in the submission's checks (``hpctrain.submit.torchside``): a rank
  that would fail at start-up is refused there, in one line naming it, before any queue wait.

Records live in ``$HPCTRAIN_CACHE`` (default ``$XDG_CACHE_HOME/hpctrain``, else ``~/.cache/hpctrain``),
``rehearsals/<fingerprint>.json``: the machine the user plans on, not a run directory (a plan has none yet).
Torch-free: read on the submit path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.schema import Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import printable
from hpctrain.paths import cache_dir
from hpctrain.plan.memory import rank_state_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from hpctrain.models.facts import ModelFacts
    from hpctrain.plan.layout import Layout
    from hpctrain.task.rehearse import Rehearsed, Role

# Beyond this many distinct roles a rehearsal is refused: at ~0.5-2 s a role on one core it would take
# longer than the queue wait it saves.
MAX_ROLES = 1024
FORMAT = 1  # a record of another format is not read (a rehearsal is cheap to run again)


def fingerprint(cfg: Config) -> str:
    """What a rank's start-up depends on: the model, the layout and its world, the batch arithmetic, the
    precision and the optimizer (its state is part of what a rank holds). Not the run's name, logging,
    schedule length, checkpoint cadence or the Slurm job's time and partition."""
    shape = run_shape(cfg)
    t = cfg.trainer
    shaped = {
        "model": cfg.model,
        "parallel": cfg.parallel,
        "optim": cfg.optim,
        "world": [shape.world_size, str(shape.degrees)],
        "batch": [t.global_batch_size, t.micro_batch_size, t.precision],
        "gpus": [cfg.cluster.gpus_per_node, cfg.cluster.gpu_memory_gib],
    }
    text = json.dumps(shaped, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _path(cfg: Config) -> Path:
    return cache_dir() / "rehearsals" / f"{fingerprint(cfg)}.json"


def record(cfg: Config, ranks: int, rehearsed: int, seconds: float, failure: str | None) -> Path | None:
    """Keep this plan's rehearsal outcome (``failure``: its one line, None when every rank started). Written
    whole (a temporary file renamed); a cache that cannot be written costs the record, not the rehearsal."""
    path = _path(cfg)
    entry = {
        "format": FORMAT,
        "time": time.time(),
        "ranks": ranks,
        "rehearsed": rehearsed,
        "seconds": round(seconds, 2),
        "failure": failure,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entry) + "\n")
        tmp.replace(path)
    except OSError:
        return None
    return path


def recorded(cfg: Config) -> dict[str, Any] | None:
    """This plan's rehearsal record, or None (never rehearsed, or a record this version cannot read)."""
    try:
        entry = json.loads(_path(cfg).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    failure = entry.get("failure")
    if not isinstance(entry.get("time"), (int, float)) or not (failure is None or isinstance(failure, str)):
        return None
    return entry


def rehearsal_line(cfg: Config) -> str:
    """The dry run's line: whether this plan was rehearsed, with what outcome, and how to."""
    entry = recorded(cfg)
    how = "hpctrain plan <the same overrides> --rehearse"
    if entry is None:
        return (
            f"Rehearsal: not rehearsed; `{how}` (or rehearse=true) runs every distinct rank's start-up here "
            "first"
        )
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(entry["time"])))
    if entry["failure"] is not None:
        return f"Rehearsal: FAILED on {when}: {printable(entry['failure'])} (`{how}` again once it is fixed)"
    return (
        f"Rehearsal: rehearsed on {when}: {entry.get('rehearsed')} of {entry.get('ranks')} ranks started "
        f"(one per distinct role) in {entry.get('seconds')} s"
    )


class RehearsalRefused(Exception):
    """A plan too large to rehearse here (one line)."""


def refuse_too_many(roles: int, world_size: int) -> None:
    """Raise :class:`RehearsalRefused` for a plan of more than :data:`MAX_ROLES` distinct roles."""
    if roles > MAX_ROLES:
        raise RehearsalRefused(
            f"{roles} distinct roles (pp × tp × cp × ep × 2 FSDP shards) of {world_size} ranks, over the "
            f"{MAX_ROLES} a rehearsal runs (~{roles} s or more): rehearse a smaller world with the same pp, "
            "tp, cp and ep degrees"
        )


AGREE = 0.01  # the planner and the rehearsal agree within 1 % on each rank's model state


def planned(cfg: Config, lay: Layout, r: Rehearsed, facts: ModelFacts | None = None) -> dict[str, int]:
    """The planner's bytes for a rehearsed rank's coordinates
    (:func:`~hpctrain.plan.memory.rank_state_bytes`): what :func:`compared` and :func:`whole_grads` read."""
    return rank_state_bytes(cfg, lay, r.pp_rank, r.shard_rank, facts)


def compared(plan: dict[str, int], r: Rehearsed) -> dict[str, tuple[int, int]]:
    """A rehearsed rank's parameter, gradient and optimizer bytes beside the planner's (:func:`planned`):
    {what: (planned, rehearsed)}. Without a backward a rehearsal's gradients are the trained parameters'
    shards (what the optimizer reads); what a backward makes whole the planner counts on top
    (:func:`whole_grads`)."""
    return {
        "params": (plan["params"], r.params),
        "grads": (plan["sharded_grads"], r.grads),
        "optimizer": (plan["optimizer"], r.optimizer),
    }


def whole_grads(plan: dict[str, int]) -> int:
    """The bytes a backward adds to a rank's gradients on top of their shards (the vocabulary-parallel
    embedding's, whole under TP without FSDP): counted by the planner (:func:`planned`), not held by a
    rehearsal."""
    return plan["grads"] - plan["sharded_grads"]


def rehearse_and_record(
    cfg: Config,
    progress: Callable[[Rehearsed], None] | None = None,
    chosen: list[Role] | None = None,
) -> list[Rehearsed]:
    """Rehearse ``cfg``'s start-up (:func:`hpctrain.task.rehearse.rehearse`, which imports torch;
    ``chosen``: its ranks, :func:`~hpctrain.task.rehearse.roles` unless given) and keep the outcome. Raises
    :class:`~hpctrain.task.rehearse.StartupFailure` for a rank that fails (recorded),
    :class:`RehearsalRefused` for a plan of more than :data:`MAX_ROLES` roles, ValueError for a data split
    that does not cover the batch."""
    from hpctrain.task.rehearse import StartupFailure, rehearse, roles

    shape = run_shape(cfg)
    chosen = roles(shape) if chosen is None else chosen
    refuse_too_many(len(chosen), shape.world_size)
    began = time.perf_counter()
    try:
        done = rehearse(cfg, chosen, progress)
    except StartupFailure as failure:
        record(cfg, shape.world_size, len(chosen), time.perf_counter() - began, str(failure))
        raise
    record(cfg, shape.world_size, len(done), time.perf_counter() - began, None)
    return done
