"""Save, commit, prune and find checkpoints (torch.distributed.checkpoint underneath).

Over 400 lines: save, commit, prune and resume share the pending save, the lineage and the writer's state,
and are read together; the writer process, the fast tier, staging and reading live in their own modules.

Save: every rank writes its shards into ``.tmp-step_N``; rank 0 writes ``manifest.json`` and renames the
directory to ``step_N`` (atomic on POSIX), then prunes all but ``keep_last``. A crash at any point leaves
either the previous committed checkpoints untouched or the new one complete.

Asynchronous save (``blocking=False``) and fast-tier copies (``local=True``): ``save`` returns once the state
is staged (``hpctrain.checkpoint.staging``: copied into a reused shared-memory segment; the parameters and
optimizer state beside the next step, whose weight update waits for the copy), and each rank's writer
process (``hpctrain.checkpoint.writer``) writes it: the shards with DCP over the writers' own gloo group,
past the page cache, checksummed as written (``hpctrain.checkpoint.direct``); the rank's copy into
node-local memory and to its peer (``hpctrain.checkpoint.fast``). While a save is pending, :meth:`poll`
(every step) asks every rank, in one all-reduce over a gloo group, whether its writer is done or failed: a
written checkpoint is committed (manifest, rename, prune; rank 0) as soon as every rank's writer is done, so
a crash loses none; one whose writer died or failed on any rank is never committed (it stays a ``.tmp-``
directory) and every rank learns it at the same step: with ``checkpoint.on_writer_failure=warn`` training
goes on with a new generation of writers and a warning, with ``stop`` it stops.

Resume: the newest committed checkpoint whose files match its manifest is loaded; a damaged one is skipped
(and logged) in favour of the one before. A fresh optimizer's state is made ready to be loaded into without
the step at lr 0 that torch's state-dict API would run for it
(``hpctrain.checkpoint.state.allocate_optimizer_state``), and cleared again when nothing loads. Sizes are
checked first; each file's checksum is verified as the reader reads it, before any of its bytes reach the
state (``hpctrain.checkpoint.reader``). When a later file
of a checkpoint fails, what was copied is overwritten by the next candidate; when none loads,
:attr:`state_touched` tells the trainer to build the fresh state again. An intact checkpoint that does not
fit the model (another shape, other parameter names) is not skipped: resume refuses with
``CheckpointMismatch`` (one line: the first key, both shapes, how to start fresh) before anything is loaded,
written or pruned. With the fast tier on, a copy in node-local memory newer than the newest shared
checkpoint is loaded first (a restart inside the same job: ``hpctrain.checkpoint.fast``).

Lineage: each manager starts a fresh lineage id, and continues the lineage of the checkpoint it resumed from.
Only checkpoints of its own lineage are pruned; a committed ``step_N`` that a save would replace and that this
manager did not write itself (another lineage's, or one it skipped as damaged or did not load) is moved aside
(``rundir.checkpoints.aside_name``). So a run never deletes or overwrites a checkpoint it did not load.

Resume on another world size: model and optimizer reshard through DCP (keys are parameter names), the
sampler counts global samples. Per-rank RNG streams (``rng_rank{r}``) are matched by rank: a rank the
checkpoint has no stream for starts a fresh, deterministic one (from its seed, rank and the step); streams of
ranks that no longer exist are ignored.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint import ranks
from hpctrain.checkpoint.fast import FastTier
from hpctrain.checkpoint.mismatch import refuse_mismatch
from hpctrain.checkpoint.pins import pinned
from hpctrain.checkpoint.reader import CheckpointNotLoadable
from hpctrain.checkpoint.safe import SafeLoadPlanner
from hpctrain.checkpoint.staging import (
    EncodingSavePlanner,
    SegmentStager,
    Staged,
    fresh_optimizers,
    state_signature,
)
from hpctrain.checkpoint.state import allocate_optimizer_state
from hpctrain.checkpoint.tiers import FileTier, SharedTier, reader_for
from hpctrain.checkpoint.writer import SaveRequest, Writer, WriterSetup, describe, store_for_writers
from hpctrain.errors import CheckpointMismatch
from hpctrain.faults import NO_FAULTS, FaultInjector
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.records import is_peer_symptom

log = logging.getLogger(__name__)

RNG_KEY = re.compile(r"rng_rank(\d+)")
WRITER_FAILURE = ("warn", "stop")
# How long a rank whose own writer has not failed waits for it to say so once a peer's has (a killed writer
# is reaped within milliseconds; a healthy one stuck in the dead one's collective never says anything).
_OWN_OUTCOME_WAIT_S = 2.0


class CheckpointWriterFailed(RuntimeError):
    """A writer process died or failed and ``checkpoint.on_writer_failure=stop``."""


@dataclass
class _Pending:
    id: int
    step: int
    tmp: Path | None  # the shared checkpoint being written (None: a fast-tier copy only)
    final: Path
    local: bool
    started: float
    failure: str | None = None  # set when staging or sending failed in this process


class CheckpointManager:
    def __init__(
        self,
        root: Path,
        keep_last: int,
        rank: int,
        config_file: Path | None = None,
        faults: FaultInjector = NO_FAULTS,
        fast_tier: FastTier | None = None,
        on_writer_failure: str = "warn",
        store_host: str = "127.0.0.1",
        timeout_s: float = 300.0,
        tier: SharedTier | None = None,
    ) -> None:
        self.root = root  # the run's checkpoints folder: its records (lineage, evaluation pins)
        self.tier = tier if tier is not None else FileTier(root)  # where the shared checkpoints are stored
        self.keep_last = keep_last
        self.rank = rank
        self.config_file = config_file
        self.faults = faults  # test-only injection points (hpctrain.faults)
        self.fast = fast_tier
        self.on_writer_failure = on_writer_failure
        self.store_host = store_host
        self.timeout_s = timeout_s
        self._pending: _Pending | None = None
        self._group: dist.ProcessGroup | None = None
        self._stager = SegmentStager()
        self._writer: Writer | None = None
        self._writer_has: int | None = None  # the staging layout the current writer has mapped
        self._store: Any = None  # rank 0: the store the writers meet through (kept alive here)
        self._store_address: tuple[str, int] | None = None
        self._generation = 0
        self._requests = 0
        self.lineage = uuid.uuid4().hex[:12]
        self._own_lineages: set[str | None] = {self.lineage}
        self._written: set[str] = set()  # names of the checkpoints this manager committed itself
        self.manifest_info: dict[str, Any] = {}  # further facts for each manifest (e.g. global_batch_size)
        # Called on rank 0 with the step of each checkpoint just committed (trainer.eval_job submits then).
        self.on_commit: Callable[[int], None] | None = None
        self.state_touched = False  # nothing loaded into a state that is not a fresh one (see resume)

    # ------------------------------------------------------------------------------------------ saving
    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        blocking: bool = True,
        shared: bool = True,
        local: bool = False,
    ) -> Path:
        """Checkpoint ``state`` as step ``step`` (collective: every rank calls it); return its final path.

        ``shared``: a checkpoint in the run directory; ``blocking=False`` returns once the state is staged
        and leaves the writing to the writer process (committed by :meth:`poll` or :meth:`wait`). ``local``:
        also a copy into the fast tier (always by the writer). A save still pending is finished first."""
        self.wait()
        final, tmp = self.tier.final(step), self.tier.target(step)
        local = local and self.fast is not None
        in_background = (shared and not blocking) or local
        if shared:
            if self.rank == 0:
                self.tier.begin(step, self._displace)
            ranks.barrier()
        if shared and blocking:
            # Returns once every rank's shards are written.
            try:
                dcp.save(dict(state), storage_writer=self.tier.writer(tmp), planner=EncodingSavePlanner())
            except BaseException:  # no checkpoint: its shards go (on a full disk, room for the run's records)
                self.tier.abandon(tmp)
                raise
            self._commit(step, tmp, final)
            ranks.barrier()
        if in_background:
            self._save_in_background(step, state, tmp if shared and not blocking else None, final, local)
        return final

    def _save_in_background(
        self, step: int, state: Mapping[str, Any], tmp: Any, final: Any, local: bool
    ) -> None:
        writer = self.start_writer()  # a writer still booting reads the request once it is up
        self._requests += 1
        pending = _Pending(self._requests, step, tmp, final, local, time.perf_counter())
        self._pending = pending
        fast_request = None
        if local and self.fast is not None:
            fast_request = self.fast.request({"lineage": self.lineage})

        def send(staged: Staged | None, error: BaseException | None) -> None:
            if writer is not self._writer:  # replaced meanwhile (a failure): this save is settled already
                return
            if staged is None:
                pending.failure = f"staging failed: {type(error).__name__}: {error}"
                return
            new_layout = self._writer_has != staged.layout
            if fast_request is not None:
                fast_request.info["signature"] = staged.signature
            writer.submit(
                SaveRequest(
                    id=pending.id,
                    step=step,
                    layout=staged.layout,
                    slots=staged.slots,
                    blobs=staged.blobs,
                    plan=staged.plan if new_layout else None,
                    segment=staged.segment if new_layout else None,
                    shared=str(tmp) if tmp is not None else None,
                    store=self.tier.store,
                    local=fast_request,
                )
            )
            self._writer_has = staged.layout

        self._stager.stage(dict(state), is_coordinator=self.rank == 0, then=send)

    def start_writer(self) -> Writer:
        """The writer process of this rank, started if there is none (collective the first time and after a
        failure: the writers of every rank join one group). Call it early: it boots beside training."""
        if self._writer is not None:
            return self._writer
        world_size = ranks.world_size()
        address = None
        if world_size > 1:
            if self._store_address is None:
                self._store, self._store_address = store_for_writers(
                    self._background_group(), self.store_host
                )
            address = self._store_address
        self._generation += 1
        self._writer = Writer(
            WriterSetup(
                self.rank,
                world_size,
                address,
                f"writers{self._generation}/",
                self.timeout_s,
                self.faults.spec if self.faults is not NO_FAULTS else None,
            )
        )
        self._writer_has = None
        return self._writer

    def overlap_staging(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Let a background save copy these optimizers' parameters and state beside the next forward and
        backward, their ``step()`` waiting for the copy (``hpctrain.checkpoint.staging``). For a loop in which
        nothing but ``step()`` changes them."""
        self._stager.defer_until_step(optimizers)

    @property
    def pending(self) -> bool:
        """Whether a save is being written in the background or waits to be committed."""
        return self._pending is not None

    def poll(self) -> None:
        """Commit the pending save if every rank's writer has finished it; handle a writer that died or
        failed. Collective while a save is pending (every rank calls it once per step): one all-reduce of
        two integers over a gloo group, so every rank decides at the same step."""
        if self._pending is not None:
            self._settle(block=False)

    def wait(self) -> None:
        """Finish and commit the pending save, if any. Collective once any save went to the writer: a rank
        whose commit :meth:`poll` already made still meets the others here, so every rank returns with the
        checkpoint committed."""
        if self._pending is not None:
            started = time.perf_counter()
            pending = self._pending
            if self._settle(block=True) and pending.tmp is not None and self.rank == 0:
                log.info(
                    "Committed %s (written by the writer process; waited %.2f s for it)",
                    pending.final.name,
                    time.perf_counter() - started,
                )
        elif self._writer is not None:
            ranks.barrier()

    def _settle(self, block: bool) -> bool:
        """Resolve the pending save if every rank's writer is done (commit: True) or any failed (False);
        ``block``: until one of them. Collective: one all-reduce per look."""
        pending = self._pending
        assert pending is not None
        while True:
            finished, failure = True, pending.failure
            if failure is None:
                finished, failure = self._writer.outcome(pending.id) if self._writer else (True, "no writer")
            done, failed = ranks.sum_over_ranks(
                [int(finished and failure is None), int(failure is not None)], self._background_group()
            )
            if failed:
                self._pending = None
                self._writer_failed(pending, failure)
                return False
            if done == ranks.world_size():
                self._pending = None
                if pending.tmp is not None:
                    self._commit(pending.step, pending.tmp, pending.final)
                    if self.rank == 0 and not block:
                        log.info("Committed %s (written beside training)", pending.final.name)
                    if block:
                        ranks.barrier()  # every rank returns with the checkpoint committed
                return True
            if not block:
                return False
            time.sleep(0.005)

    def _writer_failed(self, pending: _Pending, failure: str | None) -> None:
        """A writer died or failed: the save is not committed on any rank; new writers, or stop."""
        if failure is None and self._writer is not None:
            # A peer's writer failed first, often only because ours went away mid-collective (it reports
            # "Connection closed by peer" while ours is still being reaped): give ours a moment to say so,
            # so that the line names the cause and not only its symptom.
            deadline = time.monotonic() + _OWN_OUTCOME_WAIT_S
            while failure is None and time.monotonic() < deadline:
                finished, failure = self._writer.outcome(pending.id)
                if finished:
                    break
                time.sleep(0.01)
        every = ranks.gather_over_ranks(failure, self._background_group())
        self._stager.wait_staged_quietly()
        if self._writer is not None:
            self._writer.kill()  # the others may wait in the dead one's collectives
            self._writer = None
        what = pending.final.name if pending.tmp is not None else f"the fast-tier copy of step {pending.step}"
        failed = sorted((is_peer_symptom(text), r, text) for r, text in enumerate(every) if text)
        why = "; ".join(f"rank {r}: {text}" for _, r, text in failed)  # causes before their symptoms
        newest = layout.committed(self.tier.root)
        kept = f"{newest[0].name} stays the newest checkpoint" if newest else "there is no checkpoint yet"
        if self.rank == 0 and pending.tmp is not None:
            self.tier.abandon(pending.tmp)
        ranks.barrier()
        if self.on_writer_failure == "stop":
            raise CheckpointWriterFailed(
                f"checkpoint writer failed while writing {what} ({why}); it was not committed, {kept}; "
                f"stopping (checkpoint.on_writer_failure=stop)"
            )
        if self.rank == 0:
            log.warning(
                "Checkpoint writer failed while writing %s (%s): it was not committed, %s; training goes on "
                "with new writers (checkpoint.on_writer_failure=warn)",
                what,
                why,
                kept,
            )
        self.start_writer()  # the next generation boots beside the steps until the next save

    def close(self, end_of_job: bool = True) -> None:
        """Finish any pending save and pruning, stop the writer, free the staging segment; at the end of the
        job, remove this job's fast tier on this node (collective)."""
        self.wait()
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        self._stager.close()
        self.tier.wait()
        if end_of_job and self.fast is not None:
            self.fast.end_of_job()

    def _commit(self, step: int, tmp: Any, final: Any) -> None:
        if self.rank != 0:
            return
        self.faults.at("commit", step)
        info = {"lineage": self.lineage, **self.manifest_info}
        final = self.tier.commit(step, tmp, info, self.config_file, self._displace)
        self._written.add(final.name)
        self._prune()
        if self.on_commit is not None:
            self.on_commit(step)

    def _displace(self, final: Any) -> None:
        """A committed checkpoint where this save goes: removed when this manager wrote it (saved twice at
        one step: a periodic save, then a stop's), else moved aside, never overwritten (another lineage's,
        or one this run skipped as damaged or did not load)."""
        if final.name in self._written:
            self.tier.remove(final)
            return
        aside = layout.aside_name(final)
        why = "another run's lineage" if layout.lineage_of(final) not in self._own_lineages else "no load"
        log.warning("Moving %s aside to %s: this run did not write it (%s)", final.name, aside, why)
        self.tier.move_aside(final, aside)

    def _background_group(self) -> dist.ProcessGroup | None:
        """A gloo group of all ranks for the manager's own collectives (made on first use: collective)."""
        if self._group is None and ranks.distributed():
            self._group = dist.new_group(backend="gloo")
        return self._group

    # ---------------------------------------------------------------------------------------- resuming
    def resume(
        self,
        state: Mapping[str, Any],
        policy: str,
        check: Callable[[Path], None] | None = None,
        fresh: bool = True,
    ) -> Path | None:
        """Load ``state`` from the checkpoint chosen by ``policy`` (auto | never | a directory).

        ``check(candidate)``: called for an intact candidate before anything is loaded; it raises
        ``CheckpointMismatch`` to refuse a checkpoint the run cannot continue (another config). ``fresh``:
        whether ``state`` is a fresh run's (False: built without its random init, for a checkpoint to
        overwrite); when nothing loads into a state that is not, :attr:`state_touched` says so."""
        self.state_touched = self.state_touched or not fresh
        loaded = self._resume(state, policy, check)
        if loaded is not None:  # the state is that checkpoint's
            self.state_touched = False
        if loaded is None and ranks.world_size() > 1:
            # A fresh lineage is rank 0's: every rank's fast-tier copies and every manifest must name one.
            self.lineage = ranks.gather_over_ranks(self.lineage, self._background_group())[0]
            self._own_lineages = {self.lineage}
        if self.fast is not None:
            if self.rank == 0:
                layout.write_lineage(self.root, self.lineage, self.fast.paths.job)
            step = int(getattr(state.get("train"), "step", 0)) if loaded else 0
            self.fast.after_resume(self.lineage, step)
        if loaded is None:
            self.state_touched = bool(
                ranks.sum_over_ranks([int(self.state_touched)], self._background_group())[0]
            )
        ranks.barrier()
        return loaded

    def _resume(
        self, state: Mapping[str, Any], policy: str, check: Callable[[Path], None] | None
    ) -> Path | None:
        if policy == "never":
            return None
        # The optimizers' state made ready to be loaded into without torch's step at lr 0 (the larger part of
        # a resume's time otherwise); cleared again when no checkpoint is loaded (they stay fresh).
        allocated = [o for o in fresh_optimizers(dict(state)) if allocate_optimizer_state(o)]
        loaded = self._resume_from(state, policy, check)
        if loaded is None and not self.state_touched:
            for optimizer in allocated:
                optimizer.state.clear()
        return loaded

    def _resume_from(
        self, state: Mapping[str, Any], policy: str, check: Callable[[Path], None] | None
    ) -> Path | None:
        explicit = policy != "auto"
        candidates = [Path(policy)] if explicit else layout.committed(self.tier.root)
        if not explicit and self.fast is not None:
            newest_shared = next(
                (c for c in candidates if layout.problem_with(c, checksums=False) is None), None
            )
            found = self._fast_tier(state, layout.step_of(newest_shared) if newest_shared else -1)
            if found is not None:
                return found
        for candidate in candidates:
            started = time.perf_counter()
            problem = layout.problem_with(
                candidate, checksums=False
            )  # the reader verifies each file's checksum
            if problem is None and check is not None:
                check(candidate)
            if problem is None:
                problem = self._load(candidate, state)
            if problem is None:
                log.info(
                    "Resumed from %s (step %d): files checked and loaded in %.2f s",
                    candidate,
                    layout.step_of(candidate),
                    time.perf_counter() - started,
                )
                self._continue_lineage(layout.lineage_of(candidate))
                self._discard_uncommitted()
                return candidate
            log.warning("Skipping checkpoint %s: %s", candidate, problem)
            if explicit:
                raise CheckpointNotLoadable(f"trainer.resume={candidate}: {problem}")
        if candidates:
            log.warning("No loadable checkpoint in %s: starting from scratch", self.tier.root)
        self._discard_uncommitted()
        return None

    def _fast_tier(self, state: Mapping[str, Any], newer_than: int) -> Path | None:
        assert self.fast is not None
        started = time.perf_counter()
        found = self.fast.candidates(layout.current_lineage(self.root), state_signature(dict(state)))

        def load(copy: Path) -> str | None:
            return self._load(copy, state, fits=False, no_dist=True)

        got = self.fast.restore(found, newer_than, self._background_group(), load)
        if got is None:
            return None
        step, copy, origin = got
        log.info(
            "Resumed from the fast tier (step %d, newer than the shared tier's %s): %s, checked and loaded "
            "in %.2f s",
            step,
            f"step {newer_than}" if newer_than >= 0 else "none",
            origin,
            time.perf_counter() - started,
        )
        self._continue_lineage(layout.lineage_of(copy))
        self._discard_uncommitted()
        return copy

    def _continue_lineage(self, lineage: str | None) -> None:
        if lineage is None:  # written before lineages: this run continues it
            self._own_lineages.add(None)
        else:
            self.lineage = lineage
            self._own_lineages = {lineage}

    def _load(
        self, directory: Path, state: Mapping[str, Any], fits: bool = True, no_dist: bool = False
    ) -> str | None:
        reader = None
        try:
            reader = reader_for(directory, rank=self.rank)
            metadata = reader.read_metadata()
            saved = {key.split(".", 1)[0] for key in metadata.state_dict_metadata}
            if fits:
                refuse_mismatch(directory, metadata.state_dict_metadata, state)
            # A rank the checkpoint has no RNG stream for (it was written by fewer ranks) loads the rest.
            absent = [key for key in state if RNG_KEY.fullmatch(key) and key not in saved]
            with warnings.catch_warnings():  # a fast-tier copy is one rank's by design: DCP's note is noise
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(
                    {k: v for k, v in state.items() if k not in absent},
                    storage_reader=reader,
                    planner=SafeLoadPlanner(),
                    no_dist=no_dist,
                )
        except (KeyboardInterrupt, SystemExit, CheckpointMismatch):
            raise
        except BaseException as err:  # DCP's CheckpointException derives from BaseException
            # A file that fails its checksum is found before any of its bytes reach the state; one found
            # after another file's were copied leaves part of this checkpoint in it, which the next
            # checkpoint loaded overwrites (every tensor) or, when none loads, the trainer builds afresh.
            self.state_touched = self.state_touched or (reader is not None and reader.touched)
            return describe(err)
        step = layout.step_of(directory)
        saved_ranks = sorted(int(m.group(1)) for key in saved if (m := RNG_KEY.fullmatch(key)))
        for key in absent:
            seed = state[key].fresh_stream(int(RNG_KEY.fullmatch(key).group(1)), step)
            log.info(
                "%s has no RNG state for %s (saved by %d rank(s)): fresh stream seeded %d",
                directory.name,
                key,
                len(saved_ranks),
                seed,
            )
        gone = [r for r in saved_ranks if r >= ranks.world_size()]
        if gone and self.rank == 0:
            log.info(
                "%s was saved by %d ranks, this run has %d: RNG states of ranks %s are not used",
                directory.name,
                len(saved_ranks),
                ranks.world_size(),
                ", ".join(map(str, gone)),
            )
        return None

    def _prune(self) -> None:
        """Delete this lineage's checkpoints beyond ``keep_last`` (the tier uncommits them at once and deletes
        them beside training); never one of another lineage or one that was not committed."""
        own = [c for c in layout.committed(self.tier.root) if layout.lineage_of(c) in self._own_lineages]
        beyond = own[self.keep_last :]
        # trainer.eval_job: a checkpoint whose evaluation job has not read it yet stays, whatever keep_last
        # says (the job may wait in the queue for hours); it goes at the first prune after the job read it.
        kept = pinned(self.root, [layout.step_of(c) for c in beyond]) if beyond else set()
        self.tier.prune([old for old in beyond if layout.step_of(old) not in kept])

    def _discard_uncommitted(self) -> None:
        if self.rank == 0:
            for tmp in self.tier.uncommitted():
                if not tmp.name.startswith(layout.PRUNED_PREFIX):
                    log.info("Removing %s: a checkpoint that was never committed", tmp.name)
                self.tier.abandon(tmp)
        ranks.barrier()
