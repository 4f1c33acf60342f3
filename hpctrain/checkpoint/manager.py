"""Save, commit, prune and find checkpoints (torch.distributed.checkpoint underneath).

Save: every rank writes its shards into ``.tmp-step_N``; rank 0 writes ``manifest.json`` and renames the
directory to ``step_N`` (atomic on POSIX), then prunes all but ``keep_last``. A crash at any point leaves
either the previous committed checkpoints untouched or the new one complete.

Asynchronous save (``blocking=False``): ``save`` returns once every tensor has been copied off the live state
(staging, ``hpctrain.checkpoint.staging``: the copy buffers are kept and reused by the next save; with
``overlap_staging`` the parameters and optimizer state are copied beside the next step, whose weight update
waits for the copy), and a background thread writes the shards
with ``dcp.async_save`` over a dedicated gloo process group (the training thread keeps the default group for
its own collectives), at low CPU priority, past the page cache, checksumming as it writes
(``hpctrain.checkpoint.direct``): committing reads nothing back. The write is committed (manifest, rename,
prune; rank 0) by ``poll()`` as soon as it has finished (the trainer polls every step), else by the next
``save`` or by ``wait()``: DCP's save ends with rank 0 writing ``.metadata`` after
every rank has reported its shards written, so rank 0's completion means every rank's shards are on disk.
Until then it is only a ``.tmp-`` directory, so a crash mid-write leaves the committed checkpoints as they
were.

Resume: the newest committed checkpoint whose files match its manifest is loaded; a damaged one is skipped
(and logged) in favour of the one before. Damage is detected before anything is read into the model, so a
partial checkpoint is never loaded. An intact checkpoint that does not fit the model (another shape, other
parameter names) is not skipped: resume refuses with ``CheckpointMismatch`` (one line: the first key, both
shapes, how to start fresh) before anything is loaded, written or pruned.

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
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint.direct import DirectWriter
from hpctrain.checkpoint.safe import SafeFileSystemReader, SafeLoadPlanner
from hpctrain.checkpoint.staging import BufferStager
from hpctrain.errors import START_FRESH, CheckpointMismatch
from hpctrain.faults import NO_FAULTS, FaultInjector
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.files import fsync_dir

log = logging.getLogger(__name__)

RNG_KEY = re.compile(r"rng_rank(\d+)")


class CheckpointNotLoadable(RuntimeError):
    pass


class CheckpointManager:
    def __init__(
        self,
        root: Path,
        keep_last: int,
        rank: int,
        config_file: Path | None = None,
        faults: FaultInjector = NO_FAULTS,
    ) -> None:
        self.root = root
        self.keep_last = keep_last
        self.rank = rank
        self.config_file = config_file
        self.faults = faults  # test-only injection points (hpctrain.faults)
        self._pending: _PendingSave | None = None
        self._group: dist.ProcessGroup | None = None
        self._stager = BufferStager()
        self._deleting: list[threading.Thread] = []  # pruned checkpoints being deleted
        self._async_saves = False  # once true (on every rank alike), wait() is collective
        self.lineage = uuid.uuid4().hex[:12]
        self._own_lineages: set[str | None] = {self.lineage}
        self._written: set[str] = set()  # names of the checkpoints this manager committed itself
        self.manifest_info: dict[str, Any] = {}  # further facts for each manifest (e.g. global_batch_size)

    def save(self, step: int, state: Mapping[str, Any], blocking: bool = True) -> Path:
        """Checkpoint ``state`` as step ``step`` (collective: every rank calls it); return its final path.

        ``blocking=False``: return as soon as the state is staged (copied), so the caller may change the
        weights again; the shards are written in the background and committed by the next ``save`` or by
        ``wait()``. Either way a save still pending from before is finished and committed first."""
        self.wait()
        final = self.root / layout.checkpoint_name(step)
        tmp = self.root / f"{layout.TMP_PREFIX}{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # an earlier attempt at this step that never committed
            tmp.mkdir(parents=True)
        group = None if blocking else self._background_group()
        _barrier()
        if blocking:
            # Returns once every rank's shards and .metadata are written.
            dcp.save(dict(state), storage_writer=DirectWriter(tmp))
            self._commit(step, tmp, final)
            _barrier()
        else:
            self._async_saves = True
            writer = DirectWriter(tmp, background=True)
            response = dcp.async_save(
                dict(state), storage_writer=writer, process_group=group, async_stager=self._stager
            )
            # Staging beside the next step (``overlap_staging``) gives a response of two futures.
            future = response if isinstance(response, Future) else response.upload_completion
            self._pending = _PendingSave(step, tmp, final, future)
        return final

    def overlap_staging(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Let an asynchronous save copy these optimizers' parameters and state beside the next forward and
        backward, their ``step()`` waiting for the copy (``hpctrain.checkpoint.staging``). For a loop in which
        nothing but ``step()`` changes them."""
        self._stager.defer_until_step(optimizers)

    def wait(self) -> None:
        """Finish and commit the pending asynchronous save, if any. Collective once any save was asynchronous:
        a rank whose write :meth:`poll` already committed still meets the others here."""
        pending, self._pending = self._pending, None
        started = time.perf_counter()
        if pending is not None:
            pending.future.result()  # re-raises this rank's write failure (DCP fails every rank alike)
            self._commit(pending.step, pending.tmp, pending.final)
        if self._async_saves:
            _barrier()  # every rank returns with the checkpoint committed
        if pending is not None:
            log.info(
                "Committed %s (asynchronous save; waited %.2f s for it)",
                pending.final.name,
                time.perf_counter() - started,
            )

    def poll(self) -> None:
        """Commit the pending asynchronous save now if its write has finished (not collective: each rank
        looks at its own write; rank 0's finishes last, after every rank's shards and ``.metadata``). Called
        every step, it leaves a written checkpoint uncommitted for one step at most: a crash loses none."""
        pending = self._pending
        if pending is None or not pending.future.done():
            return
        self._pending = None
        pending.future.result()
        self._commit(pending.step, pending.tmp, pending.final)
        if self.rank == 0:
            log.info("Committed %s (asynchronous save, written beside training)", pending.final.name)

    @property
    def pending(self) -> bool:
        """Whether an asynchronous save is written or waits to be committed."""
        return self._pending is not None

    def close(self) -> None:
        """Finish any pending save and pruning, and free the staging buffers (a copy of the whole state)."""
        self.wait()
        self._stager.close()
        for deleting in self._deleting:
            deleting.join()
        self._deleting = []

    def _commit(self, step: int, tmp: Path, final: Path) -> None:
        if self.rank != 0:
            return
        self.faults.at("commit", step)
        if self.config_file is not None:
            shutil.copy2(self.config_file, tmp / self.config_file.name)
        layout.write_manifest(tmp, step, lineage=self.lineage, **self.manifest_info)
        if final.exists():
            if final.name in self._written:  # saved twice at one step (a periodic save, then a stop's)
                shutil.rmtree(final)
            else:  # never overwritten: another lineage's, or one this run skipped (damaged) or did not load
                aside = self.root / layout.aside_name(final)
                why = (
                    "another run's lineage"
                    if layout.lineage_of(final) not in self._own_lineages
                    else "no load"
                )
                log.warning(
                    "Moving %s aside to %s: this run did not write it (%s)", final.name, aside.name, why
                )
                final.rename(aside)
        tmp.rename(final)
        self._written.add(final.name)
        fsync_dir(self.root)
        self._prune()

    def _background_group(self) -> dist.ProcessGroup | None:
        """A gloo group of all ranks for the writer thread's collectives (made on first use: collective)."""
        if self._group is None and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group

    def resume(
        self, state: Mapping[str, Any], policy: str, check: Callable[[Path], None] | None = None
    ) -> Path | None:
        """Load ``state`` from the checkpoint chosen by ``policy`` (auto | never | a directory).

        ``check(candidate)``: called for an intact candidate before anything is loaded; it raises
        ``CheckpointMismatch`` to refuse a checkpoint the run cannot continue (another config)."""
        if policy == "never":
            return None
        explicit = policy != "auto"
        candidates = [Path(policy)] if explicit else layout.committed(self.root)
        for candidate in candidates:
            # Timed apart for the log: the check reads every file once (its CRC-32), the load after it.
            started = time.perf_counter()
            problem = layout.problem_with(candidate)
            if problem is None and check is not None:
                check(candidate)
            checked = time.perf_counter()
            if problem is None:
                problem = self._load(candidate, state)
            if problem is None:
                log.info(
                    "Resumed from %s (step %d): files checked in %.2f s, state loaded in %.2f s",
                    candidate,
                    layout.step_of(candidate),
                    checked - started,
                    time.perf_counter() - checked,
                )
                lineage = layout.lineage_of(candidate)
                if lineage is None:  # written before lineages: this run continues it
                    self._own_lineages.add(None)
                else:
                    self.lineage = lineage
                    self._own_lineages = {lineage}
                self._discard_uncommitted()
                return candidate
            log.warning("Skipping checkpoint %s: %s", candidate, problem)
            if explicit:
                raise CheckpointNotLoadable(f"trainer.resume={candidate}: {problem}")
        if candidates:
            log.warning("No loadable checkpoint in %s: starting from scratch", self.root)
        self._discard_uncommitted()
        return None

    def _load(self, directory: Path, state: Mapping[str, Any]) -> str | None:
        try:
            metadata = SafeFileSystemReader(directory).read_metadata()
            saved = {key.split(".", 1)[0] for key in metadata.state_dict_metadata}
            _check_fits(directory, metadata.state_dict_metadata, state)
            # A rank the checkpoint has no RNG stream for (it was written by fewer ranks) loads the rest.
            absent = [key for key in state if RNG_KEY.fullmatch(key) and key not in saved]
            dcp.load(
                {k: v for k, v in state.items() if k not in absent},
                storage_reader=SafeFileSystemReader(directory),
                planner=SafeLoadPlanner(),
            )
        except (KeyboardInterrupt, SystemExit, CheckpointMismatch):
            raise
        except BaseException as err:  # DCP's CheckpointException derives from BaseException
            # Shards are checked against the manifest first, so this is rare (bit rot, a changed model).
            # Each tensor of every state is overwritten by whichever checkpoint loads next, so falling
            # back leaves nothing of this one behind.
            return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
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
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        gone = [r for r in saved_ranks if r >= world_size]
        if gone and self.rank == 0:
            log.info(
                "%s was saved by %d ranks, this run has %d: RNG states of ranks %s are not used",
                directory.name,
                len(saved_ranks),
                world_size,
                ", ".join(map(str, gone)),
            )
        return None

    def _prune(self) -> None:
        """Delete this lineage's checkpoints beyond ``keep_last``: renamed out of the committed ones at once,
        deleted by a thread (unlinking a 1.4 GiB shard took 0.27 s here, on the training thread otherwise).
        A crash mid-delete leaves a ``.tmp-`` directory, which the next run's resume removes."""
        own = [c for c in layout.committed(self.root) if layout.lineage_of(c) in self._own_lineages]
        for old in own[self.keep_last :]:
            doomed = old.with_name(layout.PRUNED_PREFIX + old.name)
            shutil.rmtree(doomed, ignore_errors=True)  # a leftover of an earlier crash: same name
            old.rename(doomed)
            deleting = threading.Thread(target=shutil.rmtree, args=(doomed,), kwargs={"ignore_errors": True})
            deleting.start()
            self._deleting.append(deleting)
        self._deleting = [t for t in self._deleting if t.is_alive()]

    def _discard_uncommitted(self) -> None:
        if self.rank == 0 and self.root.is_dir():
            for tmp in self.root.glob(f"{layout.TMP_PREFIX}*"):
                if not tmp.name.startswith(layout.PRUNED_PREFIX):
                    log.info("Removing %s: a checkpoint that was never committed", tmp.name)
                shutil.rmtree(tmp, ignore_errors=True)
        _barrier()


def _check_fits(directory: Path, saved: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Raise ``CheckpointMismatch`` naming the first model tensor whose name or shape differs between the
    checkpoint and this run (states that offer ``model_shapes()``: {parameter name: global shape})."""
    for key, stateful in state.items():
        shapes = getattr(stateful, "model_shapes", None)
        if shapes is None:
            continue
        prefix = f"{key}.model."
        mine = {f"{prefix}{name}": tuple(shape) for name, shape in _whole_model(shapes()).items()}
        # A tied parameter's second name (saved by hpctrain before it saved each weight once) is not loaded.
        aliases = {f"{prefix}{name}" for name in getattr(stateful, "saved_names", {})}
        theirs = {
            k: tuple(getattr(v, "size", ()))
            for k, v in saved.items()
            if k.startswith(prefix) and hasattr(v, "size") and k not in aliases
        }
        for name in sorted(mine.keys() | theirs.keys()):
            if mine.get(name) == theirs.get(name):
                continue
            what = name[len(prefix) :]
            if name not in theirs:
                detail = f"{what} is in the model {list(mine[name])} but not in the checkpoint"
            elif name not in mine:
                detail = f"{what} is in the checkpoint {list(theirs[name])} but not in the model"
            else:
                shapes_of = f"{list(theirs[name])} in the checkpoint, {list(mine[name])} in the model"
                detail = f"{what} has shape {shapes_of}"
            raise CheckpointMismatch(
                f"checkpoint {directory} does not match the model: {detail}; nothing was loaded or deleted; "
                f"{START_FRESH}"
            )


@dataclass
class _PendingSave:
    step: int
    tmp: Path
    final: Path
    future: Future


def _whole_model(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The union of every rank's model tensors: a pipeline stage holds only part of the model, which a
    checkpoint of the whole model must not be refused for. Collective when several ranks run."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return shapes
    every: list[dict[str, tuple[int, ...]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, shapes)
    return {name: shape for part in every if part for name, shape in part.items()}


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def read_checkpoint(directory: Path) -> dict[str, Any]:
    """A committed checkpoint as one plain (unsharded) dict, in this process: for inspection and export."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    problem = layout.problem_with(directory)
    if problem:
        raise CheckpointNotLoadable(f"{directory}: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "full.pt"
        dcp_to_torch_save(directory, path)
        return torch.load(path, weights_only=False)
