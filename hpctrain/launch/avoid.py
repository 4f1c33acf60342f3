"""The nodes a Slurm job leaves out: ``cluster.exclude`` as typed, and the nodes of the project's record
(:mod:`hpctrain.slurm.badnodes`) with evidence younger than ``cluster.bad_node_ttl_h``.

Every job hpctrain submits (a run, a sweep's arrays, a pack) asks for ``--exclude`` through
:func:`job_exclude`, and each recorded node that is left out is said once, with its evidence and how to
take it back (``hpctrain nodes --forget NODE``). A partition is never excluded whole (:func:`choose`): at
most half of its nodes are left out for the record, and never so many that fewer than the job's nodes
remain; the newest evidence goes first.

The record is a help, not a rule: when it cannot be read, or the partition's nodes cannot be listed, the
job is submitted without it and a warning says so. That is safe: a bad node the job lands on is still
caught by the health check and the fault policy, and excluded by that run.
"""

from __future__ import annotations

import functools
import sys
import time

from hpctrain.config.schema import ClusterConfig
from hpctrain.launch.jobscript import allocation_nodes, node_record
from hpctrain.slurm import badnodes, commands
from hpctrain.slurm.spec import expand_nodelist

_said: set[str] = set()  # each line once per command, however many jobs a sweep submits


def job_exclude(cluster: ClusterConfig) -> str | None:
    """``--exclude`` for a job of ``cluster``: the typed exclusion and the record's nodes it may leave out."""
    path = node_record(cluster)
    if path is None or cluster.ssh is not None:  # over ssh the jobs write the record on the cluster's side
        return cluster.exclude
    typed = expand_nodelist(cluster.exclude) if cluster.exclude else []
    try:
        fresh = badnodes.live(badnodes.read(path), cluster.bad_node_ttl_h, time.time())
    except badnodes.RecordError as err:
        _say(f"warning: {err}; no recorded node is left out (the health check still catches a bad one)")
        return cluster.exclude
    fresh = {node: e for node, e in fresh.items() if node not in typed}
    if not fresh:
        return cluster.exclude
    pool = _pool(cluster.partition)
    chosen, kept = choose(list(fresh), pool, set(typed), allocation_nodes(cluster))
    now = time.time()
    for node in chosen:
        e = fresh[node]
        _say(
            f"leaving out {node}: {e.kind} {e.age_h(now):.1f} h ago in {e.run} ({e.why[:160]}); from the "
            f"node record {path} (hpctrain nodes --forget {node} to use it again)"
        )
    if kept:
        why = (
            "sinfo cannot list the partition's nodes" if pool is None else "the partition would keep too few"
        )
        _say(f"warning: not leaving out recorded {', '.join(kept)}: {why}")
    return ",".join([*typed, *chosen]) or None


def choose(
    fresh: list[str], pool: set[str] | None, typed: set[str], needed: int
) -> tuple[list[str], list[str]]:
    """Which of the recorded nodes ``fresh`` (newest evidence first) to leave out, and which to keep: only
    nodes of the partition's ``pool`` (an unknown name would make sbatch refuse the job), at most half of
    the pool, and never fewer than ``needed`` nodes left beside the ``typed`` exclusion. Nothing when the
    pool is unknown."""
    if pool is None:
        return [], list(fresh)
    ours = [node for node in fresh if node in pool]
    room = min(len(pool) // 2, len(pool - typed) - needed)
    chosen = ours[: max(0, room)]
    return chosen, [node for node in ours if node not in chosen]


@functools.cache
def _pool(partition: str | None) -> set[str] | None:
    """The partition's nodes (sinfo), asked once per command however many jobs a sweep submits; None when
    no Slurm client can say."""
    try:
        return commands.partition_pool(partition)
    except (commands.SlurmUnavailable, RuntimeError, OSError):
        return None


def _say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"hpctrain: {line}", file=sys.stderr)
