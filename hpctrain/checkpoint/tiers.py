"""Where the shared tier's checkpoints are stored, behind one face: a folder (:class:`FileTier`,
``<run>/checkpoints``) or a prefix of an object store (:class:`~hpctrain.checkpoint.objects.ObjectTier`,
``checkpoint.path=s3://…``). The checkpoint manager decides what is saved, committed, kept and loaded;
a tier only knows how its storage does each (the anchors: torchtitan's ``CheckpointStorage``, Lightning's
``CheckpointIO``).

    tier.root                       where layout.committed() finds the committed checkpoints
    tier.final(step) / target(step) a checkpoint's name, and where its shards are written first
    tier.begin(step, displace)      rank 0, before the ranks write: an earlier attempt at the step cleared
    tier.writer(target)             DCP's storage writer (every rank; the writer process too)
    tier.commit(step, target, info, config_file, displace)   rank 0: the manifest, then committed
    tier.abandon(target)            a write that will never be committed, removed
    tier.remove / move_aside        a committed one this run replaces: its own, or another lineage's
    tier.prune(old) / wait()        committed ones beyond keep_last: uncommitted at once, deleted beside
    tier.uncommitted()              what saves that never committed left
    reader_for(directory, rank)     DCP's storage reader of a checkpoint (verified as it is read)

Committing differs by storage and is each tier's own: a folder is renamed from ``.tmp-step_N`` to
``step_N`` once its manifest is on disk; an object prefix is written in place and its manifest, written
last, is the commit.
"""

from __future__ import annotations

import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hpctrain import torchapi
from hpctrain.checkpoint.direct import DirectWriter
from hpctrain.checkpoint.objects import ObjectReader, ObjectTier, ObjectWriter
from hpctrain.checkpoint.reader import CheckpointNotLoadable, FastReader
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.files import fsync_dir
from hpctrain.rundir.objects import ObjectDir, Store, is_url

Displace = Callable[[Any], None]


class SharedTier(Protocol):
    root: Any
    store: Store | None  # where and how the writer process opens the store again; None: files

    def final(self, step: int) -> Any: ...
    def target(self, step: int) -> Any: ...
    def begin(self, step: int, displace: Displace) -> None: ...
    def writer(self, target: Any, background: bool = False, progress: Any = None) -> Any: ...
    def commit(
        self, step: int, target: Any, info: dict[str, Any], config_file: Path | None, displace: Displace
    ) -> Any: ...
    def abandon(self, target: Any) -> None: ...
    def remove(self, checkpoint: Any) -> None: ...
    def move_aside(self, checkpoint: Any, name: str) -> None: ...
    def prune(self, old: list[Any]) -> None: ...
    def wait(self) -> None: ...
    def uncommitted(self) -> list[Any]: ...


class FileTier:
    """Checkpoints in a folder: written into ``.tmp-step_N``, committed by an atomic rename."""

    store = None

    def __init__(self, root: Path) -> None:
        self.root = root
        self._deleting: list[threading.Thread] = []

    def final(self, step: int) -> Path:
        return self.root / layout.checkpoint_name(step)

    def target(self, step: int) -> Path:
        return self.root / f"{layout.TMP_PREFIX}{layout.checkpoint_name(step)}"

    def begin(self, step: int, displace: Displace) -> None:
        tmp = self.target(step)
        shutil.rmtree(tmp, ignore_errors=True)  # an earlier attempt at this step that never committed
        tmp.mkdir(parents=True)

    def writer(self, target: Any, background: bool = False, progress: Any = None) -> DirectWriter:
        return DirectWriter(target, background=background, progress=progress)

    def commit(
        self, step: int, target: Path, info: dict[str, Any], config_file: Path | None, displace: Displace
    ) -> Path:
        if config_file is not None:
            shutil.copy2(config_file, target / config_file.name)
        layout.write_manifest(target, step, **info)
        final = self.final(step)
        if final.exists():
            displace(final)
        target.rename(final)
        fsync_dir(self.root)
        return final

    def abandon(self, target: Path) -> None:
        shutil.rmtree(target, ignore_errors=True)

    def remove(self, checkpoint: Path) -> None:
        shutil.rmtree(checkpoint)

    def move_aside(self, checkpoint: Path, name: str) -> None:
        checkpoint.rename(checkpoint.parent / name)

    def prune(self, old: list[Path]) -> None:
        """Renamed out of the committed ones at once, deleted by a thread (unlinking a 1.4 GiB shard took
        0.27 s here, on the training thread otherwise). A crash mid-delete leaves a ``.tmp-`` directory,
        which the next run's resume removes."""
        for checkpoint in old:
            doomed = checkpoint.with_name(layout.PRUNED_PREFIX + checkpoint.name)
            shutil.rmtree(doomed, ignore_errors=True)  # a leftover of an earlier crash: same name
            checkpoint.rename(doomed)
            deleting = threading.Thread(target=shutil.rmtree, args=(doomed,), kwargs={"ignore_errors": True})
            deleting.start()
            self._deleting.append(deleting)
        self._deleting = [t for t in self._deleting if t.is_alive()]

    def wait(self) -> None:
        for deleting in self._deleting:
            deleting.join()
        self._deleting = []

    def uncommitted(self) -> list[Path]:
        return sorted(self.root.glob(f"{layout.TMP_PREFIX}*")) if self.root.is_dir() else []


def shared_tier(checkpoints: Path, store: Store | None) -> SharedTier:
    """The run's shared tier: its checkpoints folder, or the object store ``checkpoint.path`` names."""
    if store is None:
        return FileTier(checkpoints)
    return ObjectTier(store.root(), store)


def storage_writer(target: str, store: Store | None, background: bool = False, progress: Any = None) -> Any:
    """DCP's storage writer for ``target`` as a writer process gets it: a folder, or a store's URL."""
    if is_url(target):
        assert store is not None
        at = ObjectDir.at(target, store.options, store.timeout_s)
        return ObjectWriter(at, background=background, progress=progress)
    return DirectWriter(target, background=background, progress=progress)


def reader_for(directory: Any, rank: int = 0) -> FastReader:
    """DCP's storage reader of the checkpoint ``directory`` (a folder, or a store's prefix)."""
    if isinstance(directory, ObjectDir):
        return ObjectReader(directory, rank=rank)
    return FastReader(directory, rank=rank)


def read_checkpoint(directory: Any) -> dict[str, Any]:
    """A committed checkpoint (a folder, or a store's prefix) as one plain (unsharded) dict, in this process,
    through the safe reader: for inspection and export."""
    from hpctrain.checkpoint.safe import SafeEmptyStatePlanner

    problem = layout.problem_with(directory, checksums=False)
    if problem:
        raise CheckpointNotLoadable(f"{directory}: {problem}")
    state: dict[str, Any] = {}
    with warnings.catch_warnings():  # one process by design: DCP's note that no process group is up
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        # DCP's own converter (dcp_to_torch_save) calls this: dcp.load would fill a copy of ``state``.
        torchapi.load_state_dict_here(
            state, storage_reader=reader_for(directory), planner=SafeEmptyStatePlanner()
        )
    return state
