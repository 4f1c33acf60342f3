"""The fast tier: each rank's newest state in node-local memory, and a copy of it on a peer node.

Every ``checkpoint.local_every`` steps the writer process (``hpctrain.checkpoint.writer``) saves its rank's
own state (a DCP checkpoint of one rank: the local shards, no resharding) into ``checkpoint.local_path``
(``/dev/shm`` by default: memory) and sends it to the writer of its peer, the rank with the same local
rank on the next node ((rank + ranks per node) mod world size), which keeps it beside its own. Each
directory keeps two copies at most: a save starts once the one before is written on every rank, so the
older of the two is on every rank while the newer may still be being written. The paths
(``hpctrain.rundir.checkpoints.FastTierPaths``) are keyed by the run directory, the job and the host. A
copy is a DCP checkpoint of one rank with a version-3 manifest (sizes, CRC-32C, and the run, job, rank,
world size, lineage and a signature of the state's local layout).

A restart in the same job (:meth:`FastTier.restore`, called by ``CheckpointManager.resume``): every rank
lists the copies it has (its own, and those it holds for its peer) that belong to this run, this job, this
rank and world size, the run directory's current lineage (``checkpoints/lineage.json``) and a state of the
same layout; the ranks agree (one all-gather) on the newest step newer than the shared tier's newest
checkpoint that every rank can get: from its own copy, else from the rank that holds its copy (sent over the
process group into the rank's node-local directory). Each rank then loads its copy with the verifying reader
(``hpctrain.checkpoint.reader``: CRC-32C before any byte reaches the state). A copy that fails (truncated, a
flipped bit) is skipped with a warning for the next one (the peer's copy of the same step, then an older
step, then the shared tier); a resume never loads an unverified copy.

Nothing of the fast tier outlives its job: each rank removes its node's directories at the end of training,
the local launcher removes a launch's tier when it ends (``hpctrain.launch.local``), and a job of the same
run starting on the node removes those of earlier jobs (one run directory, one run at a time: its lock).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpctrain.checkpoint import replica
from hpctrain.errors import ConfigError
from hpctrain.rundir import checkpoints as layout

log = logging.getLogger(__name__)

GIB = 2**30


@dataclass
class Candidates:
    signature: str = ""  # this rank's state's (a held copy must have its owner's)
    own: dict[int, Path] = field(default_factory=dict)  # step → this rank's own copy
    held: dict[int, dict[int, Path]] = field(default_factory=dict)  # owner rank → step → copy held for it


# ------------------------------------------------------------------------------------ training's side
class FastTier:
    """One rank's view of the fast tier (its node-local paths, its peer) and the restart that uses it."""

    def __init__(
        self,
        paths: layout.FastTierPaths,
        host: str,
        rank: int,
        world_size: int,
        local_world_size: int,
    ) -> None:
        self.paths = paths
        self.host = host
        self.rank = rank
        self.world_size = world_size
        self.per_node = max(1, min(local_world_size, world_size))

    # --- topology
    def peer_of(self, rank: int) -> int | None:
        """The rank that keeps ``rank``'s copy: the same local rank on the next node (none on one node)."""
        if self.world_size <= self.per_node:
            return None
        return (rank + self.per_node) % self.world_size

    def source_of(self, rank: int) -> int | None:
        """The rank whose copy ``rank`` keeps."""
        if self.world_size <= self.per_node:
            return None
        return (rank - self.per_node) % self.world_size

    @property
    def own(self) -> Path:
        return self.paths.own(self.host, self.rank)

    def held(self, owner: int) -> Path:
        return self.paths.held(self.host, self.rank, owner)

    @property
    def is_node_leader(self) -> bool:
        return self.rank % self.per_node == 0

    # --- start and end
    def prepare(self, state_bytes: int, key: str) -> None:
        """Create this rank's directories (after removing the tiers of this run's earlier jobs) and refuse,
        in one line, a path that is not writable or has no room for the tier (``key``: the config key)."""
        removed = self.paths.remove_other_jobs()
        if removed and self.is_node_leader:
            log.info(
                "Removed the fast tier of this run's earlier job(s) %s on %s", ", ".join(removed), self.host
            )
        try:
            self.paths.make(self.own)
            source = self.source_of(self.rank)
            if source is not None:
                self.paths.make(self.held(source))
            probe = self.own / f".probe-{os.getpid()}"
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as err:
            raise ConfigError(
                key,
                str(self.paths.base),
                f"not writable: {err.strerror or err}",
                valid="a writable node-local directory, e.g. /dev/shm",
            ) from None
        # Per rank: the copy every rank has and the one being written, the same for the copies it keeps for
        # its peer, and the staging segment (shared memory: /dev/shm too).
        copies = 2 + (2 if self.source_of(self.rank) is not None else 0) + 1
        needed = state_bytes * copies * self.per_node
        # Copies this rank already keeps (a restart) are replaced, not added to.
        rank_dir = self.paths.rank_dir(self.host, self.rank)
        kept = sum(p.stat().st_size for p in rank_dir.rglob("*") if p.is_file()) * self.per_node
        usage = shutil.disk_usage(self.paths.user_root)
        if usage.free + kept < needed:
            raise ConfigError(
                key,
                str(self.paths.base),
                f"{(usage.free + kept) / GIB:.2f} GiB free on {self.host}, the fast tier needs "
                f"{needed / GIB:.2f} GiB ({self.per_node} rank(s) × {copies} × {state_bytes / GIB:.2f} GiB "
                f"of state: the copy every rank has and one being written"
                f"{', the same for a peer' if copies == 5 else ''}, the staging segment)",
                valid="a node-local directory with that much room (or a larger /dev/shm)",
            )

    def request(self, info: dict[str, Any]) -> replica.LocalSave:
        source = self.source_of(self.rank)
        return replica.LocalSave(
            own=str(self.own),
            info={
                **info,
                "tier": "local",
                "run": self.paths.run,
                "job": self.paths.job,
                "rank": self.rank,
                "world_size": self.world_size,
            },
            send_to=self.peer_of(self.rank),
            receive_from=source,
            held=str(self.held(source)) if source is not None else None,
        )

    def end_of_job(self) -> None:
        """Remove this job's tier on this node (collective: after every rank's last use)."""
        _barrier()
        if self.is_node_leader:
            self.paths.remove_job()
        _barrier()

    # --- restart
    def candidates(self, lineage: str | None, signature: str) -> Candidates:
        """This rank's copies that a restart may load (committed, sizes as in their manifest, this run, job,
        rank, world size, lineage and, for its own, state layout: a held copy's layout is its owner's, which
        :meth:`restore` compares); each other copy is named in a warning."""
        found = Candidates(signature)
        if lineage is None:
            return found
        expect = {
            "run": self.paths.run,
            "job": self.paths.job,
            "world_size": self.world_size,
            "lineage": lineage,
            "tier": "local",
        }
        for copy in layout.copies(self.own):
            problem = _problem(copy, {**expect, "rank": self.rank, "signature": signature})
            if problem is None:
                found.own[layout.step_of(copy)] = copy
            else:
                log.warning("Skipping fast-tier copy %s: %s", copy, problem)
        rank_dir = self.paths.rank_dir(self.host, self.rank)
        if rank_dir.is_dir():
            for held in rank_dir.iterdir():
                owner = held.name[len(layout.PEER_PREFIX) :]
                if not held.name.startswith(layout.PEER_PREFIX) or not owner.isdigit():
                    continue
                for copy in layout.copies(held):
                    problem = _problem(copy, {**expect, "rank": int(owner)})
                    if problem is None:
                        found.held.setdefault(int(owner), {})[layout.step_of(copy)] = copy
                    else:
                        log.warning("Skipping fast-tier copy %s: %s", copy, problem)
        return found

    def restore(
        self,
        found: Candidates,
        newer_than: int,
        group: dist.ProcessGroup | None,
        load: Callable[[Path], str | None],
    ) -> tuple[int, Path, str] | None:
        """Load the newest step newer than ``newer_than`` that every rank can get (collective). ``load(copy)``
        loads one copy into the state (None, or why it failed). Returns (step, this rank's copy, where it came
        from) or None when no step of the fast tier loads."""
        held = {
            o: {s: layout.read_manifest(c).get("signature") for s, c in copies.items()}
            for o, copies in found.held.items()
        }
        every = _all_gather((sorted(found.own), held, found.signature), group)
        steps = sorted(
            {s for own, _, _ in every for s in own}
            | {s for _, kept, _ in every for h in kept.values() for s in h}
        )
        for step in (s for s in reversed(steps) if s > newer_than):
            # Where each rank can get this step: its own copy first, then the ranks that hold one for it (of
            # a state laid out as the owner's is now).
            sources = []
            for r in range(self.world_size):
                ways = [r] if step in every[r][0] else []
                ways += [h for h in range(self.world_size) if every[h][1].get(r, {}).get(step) == every[r][2]]
                sources.append(ways)
            if not all(sources):
                continue
            choice = [0] * self.world_size
            while True:
                failed = self._attempt(
                    step, [ways[i] for ways, i in zip(sources, choice, strict=True)], found, group, load
                )
                failures = _all_gather(failed, group)
                if not any(failures):
                    origin = (
                        "its own copy"
                        if sources[self.rank][choice[self.rank]] == self.rank
                        else (f"the copy rank {sources[self.rank][choice[self.rank]]} kept for it")
                    )
                    return step, self.own / layout.checkpoint_name(step), origin
                if self.rank == 0:
                    for r, why in enumerate(failures):
                        if why:
                            log.warning("Fast-tier copy of rank %d, step %d, not loaded: %s", r, step, why)
                for r, why in enumerate(failures):
                    if why:
                        choice[r] += 1
                if any(choice[r] >= len(sources[r]) for r in range(self.world_size)):
                    break  # a rank has no copy of this step left: an older step, or the shared tier
        return None

    def _attempt(
        self,
        step: int,
        holders: list[int],
        found: Candidates,
        group: dist.ProcessGroup | None,
        load: Callable[[Path], str | None],
    ) -> str | None:
        """One try at ``step``: copies sent where a rank loads another's, then every rank loads."""
        problem: str | None = None
        for owner, holder in enumerate(holders):  # the same order on every rank
            if holder == owner:
                continue
            try:
                if self.rank == holder:
                    replica.send_copy(found.held[owner][step], owner, group)
                elif self.rank == owner:
                    started = time.perf_counter()
                    tmp = self.own / f"{layout.TMP_PREFIX}{layout.checkpoint_name(step)}"
                    replica.receive_copy(tmp, holder, group)
                    log.info(
                        "Received the fast-tier copy of step %d from rank %d in %.2f s",
                        step,
                        holder,
                        time.perf_counter() - started,
                    )
            except Exception as err:  # a transfer that failed is this try's failure; the next tries another
                problem = f"{type(err).__name__}: {err}"
        if problem is not None:
            return problem
        copy = self.own / layout.checkpoint_name(step)
        if holders[self.rank] == self.rank:
            copy = found.own[step]
        return load(copy)

    def after_resume(self, lineage: str, step: int) -> None:
        """Drop copies the run has moved past: of another lineage, or ahead of the step it resumed from."""
        rank_dir = self.paths.rank_dir(self.host, self.rank)
        if not rank_dir.is_dir():
            return
        for sub in (d for d in rank_dir.iterdir() if d.is_dir()):
            for copy in sub.glob(f"{layout.TMP_PREFIX}*"):
                shutil.rmtree(copy, ignore_errors=True)
            for copy in layout.copies(sub):
                if layout.lineage_of(copy) != lineage or layout.step_of(copy) > step:
                    shutil.rmtree(copy, ignore_errors=True)


def _problem(copy: Path, expect: dict[str, Any]) -> str | None:
    problem = layout.problem_with(copy, checksums=False)
    if problem is not None:
        return problem
    manifest = layout.read_manifest(copy)
    for key, value in expect.items():
        if manifest.get(key) != value:
            return f"its {key} is {manifest.get(key)!r}, this run's {value!r}"
    return None


def _all_gather(value: Any, group: dist.ProcessGroup | None) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return [value]
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, value, group=group)
    return every


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
