"""Save, commit, prune and find checkpoints (torch.distributed.checkpoint underneath).

Save: every rank writes its shards into ``.tmp-step_N``; rank 0 writes ``manifest.json`` and renames the
directory to ``step_N`` (atomic on POSIX), then prunes all but ``keep_last``. A crash at any point leaves
either the previous committed checkpoints untouched or the new one complete.

Resume: the newest committed checkpoint whose files match its manifest is loaded; a damaged one is skipped
(and logged) in favour of the one before. Damage is detected before anything is read into the model, so a
partial checkpoint is never loaded.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint import layout

log = logging.getLogger(__name__)


class CheckpointNotLoadable(RuntimeError):
    pass


class CheckpointManager:
    def __init__(self, root: Path, keep_last: int, rank: int, config_file: Path | None = None) -> None:
        self.root = root
        self.keep_last = keep_last
        self.rank = rank
        self.config_file = config_file

    def save(self, step: int, state: Mapping[str, Any]) -> Path:
        final = self.root / layout.checkpoint_name(step)
        tmp = self.root / f"{layout.TMP_PREFIX}{final.name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # an earlier attempt at this step that never committed
            tmp.mkdir(parents=True)
        _barrier()
        dcp.save(dict(state), checkpoint_id=tmp)  # returns once every rank's shards and .metadata are written
        if self.rank == 0:
            if self.config_file is not None:
                shutil.copy2(self.config_file, tmp / self.config_file.name)
            layout.write_manifest(tmp, step)
            if final.exists():  # re-saving a step after a resume from an older checkpoint
                shutil.rmtree(final)
            tmp.rename(final)
            layout.fsync_dir(self.root)
            self._prune()
        _barrier()
        return final

    def resume(self, state: Mapping[str, Any], policy: str) -> Path | None:
        """Load ``state`` from the checkpoint chosen by ``policy`` (auto | never | a directory)."""
        if policy == "never":
            return None
        explicit = policy != "auto"
        candidates = [Path(policy)] if explicit else layout.committed(self.root)
        for candidate in candidates:
            problem = layout.problem_with(candidate)
            if problem is None:
                problem = self._load(candidate, state)
            if problem is None:
                log.info("Resumed from %s (step %d)", candidate, layout.step_of(candidate))
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
            dcp.load(dict(state), checkpoint_id=directory)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # DCP's CheckpointException derives from BaseException
            # Shards are checked against the manifest first, so this is rare (bit rot, a changed model).
            # Each tensor of every state is overwritten by whichever checkpoint loads next, so falling
            # back leaves nothing of this one behind.
            return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        return None

    def _prune(self) -> None:
        for old in layout.committed(self.root)[self.keep_last :]:
            shutil.rmtree(old, ignore_errors=True)

    def _discard_uncommitted(self) -> None:
        if self.rank == 0 and self.root.is_dir():
            for tmp in self.root.glob(f"{layout.TMP_PREFIX}*"):
                log.info("Removing %s: a checkpoint that was never committed", tmp.name)
                shutil.rmtree(tmp, ignore_errors=True)
        _barrier()


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
