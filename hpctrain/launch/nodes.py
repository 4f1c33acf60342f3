"""A lost node does not end the job (``cluster.spare_nodes``, ``cluster.min_nodes``). No torch here.

The job asks Slurm for ``nodes + spare_nodes`` nodes. Each generation of a job start's ranks runs on
``nodes`` of them, its *members* (``RUN_DIR/agents/<job>.members``, in rank order; at first the allocation's
first nodes that no earlier start of the run lost); the restart agents (:mod:`hpctrain.launch.agent`) on the
other nodes wait, and tell their workers nothing. Every agent touches a liveness file
(``agents/<job>.alive/<node>.<local id>``) while it lives. When a generation fails and the failure looks
like a lost peer (a connection closed, a hang), the agent that claims the restart waits until a dead node's
files would be stale (:data:`LOST_AFTER_S`) and takes every member none of whose agents touched its file
since for lost (its slurmd gone, its ranks unreachable: the node's processes died with it). The lost node's
place goes to a live spare, in place (the survivors keep their ranks); with no spare left, the generation
runs on fewer nodes, down to ``min_nodes``: the data-parallel size shrinks and the global batch is kept by
more accumulation (:func:`hpctrain.config.shape.on_nodes`), the checkpoint and the data position reshard on
load. Below ``min_nodes`` there is no restart: the fault is answered as before (a requeue).

A lost node is recorded in faults.jsonl (``"excluded": true``, the record health checks and hangs write):
no later generation of the job start takes it back, and every later requeue of the run excludes it
(:func:`hpctrain.resilience.requeue.excluded_nodes`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.rendezvous.env import NODES_ENV, this_node
from hpctrain.resilience.requeue import excluded_nodes, note_bad_node
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_write
from hpctrain.slurm.spec import expand_nodelist

# A node none of whose agents touched its liveness file for this long is lost. The agents touch theirs every
# ALIVE_EVERY_S from a thread of their own, which a busy agent loop does not hold up.
ALIVE_EVERY_S = 0.2
LOST_AFTER_S = 2.0


@dataclass(frozen=True)
class Replacement:
    """What a generation that lost ``lost`` runs on next: ``members`` (rank order); ``spares``: the spares
    that took lost places; ``shrunk``: fewer nodes than ``cluster.nodes``."""

    members: list[str]
    lost: list[str]
    spares: list[str]
    shrunk: bool


def replace_lost(
    members: list[str], lost: Iterable[str], candidates: list[str], wanted: int, min_nodes: int
) -> Replacement | None:
    """The next members after ``lost`` of ``members`` were lost: each lost node's place taken in place by
    the next of ``candidates`` (live spares, in allocation order), and without one the place left out, down
    to ``min_nodes`` nodes; None when fewer would remain (no restart inside the allocation)."""
    gone = [n for n in members if n in set(lost)]
    spares = [n for n in candidates if n not in members and n not in gone]
    taken: list[str] = []
    after: list[str] = []
    for node in members:
        if node not in gone:
            after.append(node)
        elif spares:
            taken.append(spares.pop(0))
            after.append(taken[-1])
    while len(after) < wanted and spares:  # an earlier shrink, undone by a spare that came back
        taken.append(spares.pop(0))
        after.append(taken[-1])
    if len(after) < min_nodes:
        return None
    return Replacement(after, gone, taken, len(after) < wanted)


def first_members(allocation: list[str], excluded: set[str], wanted: int) -> list[str]:
    """The members of a job start's first generation: the allocation's first ``wanted`` nodes the run did
    not lose earlier (the rest wait as spares)."""
    usable = [n for n in allocation if n not in excluded]
    return (usable or allocation)[:wanted]


class Nodes:
    """One job start's members and liveness files, as one Slurm task's agent sees them."""

    def __init__(self, run_dir: Path, job: str, wanted: int, min_nodes: int | None) -> None:
        self.rd = RunDir(run_dir)
        self.job = job
        self.wanted = wanted
        self.min_nodes = wanted if min_nodes is None else min_nodes
        self.node = this_node(dict(os.environ))
        self.local = int(os.environ.get("SLURM_LOCALID", "0"))
        self.allocation = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", self.node))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def members(self) -> list[str]:
        try:
            found = json.loads(self.rd.agent_members(self.job).read_text())
        except (FileNotFoundError, ValueError):
            return first_members(self.allocation, excluded_nodes(self.rd.path), self.wanted)
        return [str(n) for n in found] if isinstance(found, list) else []

    def place(self, members: list[str]) -> dict[str, str]:
        """What this task's worker is told of its place among ``members`` (it is one of them)."""
        per_node = int(os.environ.get("SLURM_NTASKS", "1")) // max(1, len(self.allocation))
        index = members.index(self.node)
        return {
            NODES_ENV: ",".join(members),
            "SLURM_PROCID": str(index * per_node + self.local),
            "SLURM_NTASKS": str(len(members) * per_node),
            "SLURM_NODEID": str(index),
        }

    def start(self) -> None:
        """Touch this task's liveness file every ALIVE_EVERY_S until :meth:`close`."""
        path = self.rd.agent_alive(self.job, self.node, self.local)
        path.parent.mkdir(parents=True, exist_ok=True)

        def beat() -> None:
            while not self._stop.is_set():
                with contextlib.suppress(OSError):
                    path.touch()
                self._stop.wait(ALIVE_EVERY_S)

        self._thread = threading.Thread(target=beat, name="hpctrain-alive", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def stale(self, nodes: Iterable[str], now: float | None = None) -> list[str]:
        """The ``nodes`` none of whose agents touched its liveness file in the last LOST_AFTER_S."""
        now = time.time() if now is None else now
        folder = self.rd.agent_alive(self.job, "x", 0).parent
        newest: dict[str, float] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(folder):
                node = entry.name.rsplit(".", 1)[0]
                with contextlib.suppress(OSError):
                    newest[node] = max(newest.get(node, 0.0), entry.stat().st_mtime)
        return [n for n in nodes if now - newest.get(n, 0.0) > LOST_AFTER_S]

    def replace(self, since: float) -> Replacement | None:
        """After a generation failed at ``since`` with a peer's symptom: which members are lost (waiting
        until a lost node's files would be stale), and what runs next. None: no member is lost."""
        wait = since + LOST_AFTER_S + ALIVE_EVERY_S - time.time()
        if wait > 0:
            time.sleep(wait)
        members = self.members()
        lost = self.stale(members)
        if not lost:
            return None
        excluded = excluded_nodes(self.rd.path)
        live = [n for n in self.allocation if n not in excluded and n not in self.stale(self.allocation)]
        found = replace_lost(members, lost, live, self.wanted, self.min_nodes)
        return found or Replacement([], lost, [], True)

    def commit(self, replacement: Replacement, step: int, job_id: str | None) -> None:
        """Record the lost nodes (excluded from every later rendezvous and requeue of the run) and the next
        generation's members, before the generation moves on."""
        how = (
            f"replaced by {', '.join(replacement.spares)}"
            if replacement.spares
            else f"left out: continuing on {len(replacement.members)} of {self.wanted} nodes"
        )
        for node in replacement.lost:
            note_bad_node(
                self.rd.path,
                node,
                "lost node",
                f"no agent on {node} answered for {LOST_AFTER_S:.0f} s",
                job_id,
            )
            self.rd.append_fault(
                {
                    "time": time.time(),
                    "job_id": job_id,
                    "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
                    "rank": None,  # every rank of the node
                    "host": node,
                    "step": step,
                    "why": f"node lost: no agent on {node} answered for {LOST_AFTER_S:.0f} s",
                    "action": how,
                    "excluded": True,
                }
            )
        atomic_write(self.rd.agent_members(self.job), json.dumps(replacement.members))

    def done(self) -> None:
        """The job start's ranks are done (finished, stopped, given up): its spares may leave."""
        with contextlib.suppress(OSError):
            atomic_write(self.rd.agent_done(self.job), "done")

    def is_done(self) -> bool:
        return self.rd.agent_done(self.job).exists()
