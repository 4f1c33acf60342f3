"""Copies of one rank's checkpoint in node-local memory, and how they move between ranks.

Used by the fast tier (``hpctrain.checkpoint.fast``): the writer process saves its rank's own copy
(:func:`save_local`) and exchanges copies with its peer over the writers' group (:func:`exchange`: each rank
sends its copy and receives its source's at once, so a ring of ranks doing both never waits on itself); a
restart sends a kept copy to the rank that needs it over the training processes' group (:func:`send_copy`,
:func:`receive_copy`). Files travel as tensors over mapped files (no copy into a buffer of ours), the header
is the copy's manifest (JSON: sizes and CRC-32C), and a received copy is checked against it before it is
committed by a rename. A directory keeps two copies at most (:func:`_trim`).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.files import atomic_json


@dataclass(frozen=True)
class LocalSave:
    """What the writer does for one fast-tier save (sent with its request)."""

    own: str  # this rank's own copies
    info: dict[str, Any]  # the manifest's facts: lineage, run, job, rank, world size, signature
    send_to: int | None = None  # the peer rank that keeps a copy of ours
    receive_from: int | None = None  # the rank whose copy we keep
    held: str | None = None  # where we keep it


def save_local(
    local: LocalSave, step: int, planner: Any, progress: Callable[[int], None] | None = None
) -> Path:
    """Save this rank's staged state into its node-local directory and commit it (beside the copy before);
    then exchange copies with the peer. Runs in the writer process."""
    import torch.distributed.checkpoint as dcp

    from hpctrain.checkpoint.direct import DirectWriter

    own = Path(local.own)
    _trim(own)
    tmp = own / f"{layout.TMP_PREFIX}{layout.checkpoint_name(step)}"
    dcp.save(
        {}, storage_writer=DirectWriter(tmp, direct=False, progress=progress), planner=planner, no_dist=True
    )
    layout.write_manifest(tmp, step, **local.info)
    final = _commit(tmp, own, step)
    if local.send_to is not None and local.receive_from is not None and local.held is not None:
        exchange(final, local.send_to, Path(local.held), local.receive_from, step)
    return final


def _trim(directory: Path) -> None:
    """Before a new copy is written: keep only the newest committed one. A save is started only once the one
    before is written on every rank, so that copy is one every rank has; with the one being written, a
    directory holds two copies at most, and a restart always finds a step all ranks share."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"{layout.TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    for older in layout.copies(directory)[1:]:
        shutil.rmtree(older, ignore_errors=True)


def _commit(tmp: Path, directory: Path, step: int) -> Path:
    """Rename ``tmp`` to ``step_N`` in ``directory`` (a copy of that step already there is replaced)."""
    final = directory / layout.checkpoint_name(step)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def exchange(
    copy: Path | None, send_to: int | None, held: Path | None, receive_from: int | None, step: int
) -> Path | None:
    """Send ``copy`` to rank ``send_to`` and receive the copy of rank ``receive_from`` into ``held`` (either
    may be None), at once: with every rank of a ring doing both, neither waits for the other. Returns the
    copy received, verified and committed in ``held``."""
    outgoing = _header(copy) if copy is not None else None
    length = torch.zeros(1, dtype=torch.int64)
    sent_length = torch.tensor([len(outgoing) if outgoing is not None else 0], dtype=torch.int64)
    _swap(sent_length if outgoing is not None else None, send_to, length, receive_from)
    header = torch.zeros(int(length.item()), dtype=torch.uint8)
    sent_header = torch.frombuffer(bytearray(outgoing or b"\0"), dtype=torch.uint8)
    _swap(sent_header if outgoing is not None else None, send_to, header, receive_from)
    manifest = json.loads(header.numpy().tobytes()) if receive_from is not None else None
    maps: list[mmap.mmap] = []
    works, tensors = [], []
    try:
        if copy is not None:
            for name, size in _files(layout.read_manifest(copy)):
                if size:
                    tensor, mapping = _mapped(copy / name, size, create=False)
                    maps.append(mapping)
                    tensors.append(tensor)
                    works.append(dist.isend(tensor, send_to))
        tmp = None
        if manifest is not None and held is not None:
            if manifest.get("step") != step:
                raise RuntimeError(f"rank {receive_from} sent step {manifest.get('step')}, not {step}")
            _trim(held)
            tmp = held / f"{layout.TMP_PREFIX}{layout.checkpoint_name(step)}"
            tmp.mkdir(parents=True)
            for name, size in _files(manifest):
                target = tmp / name
                if not size:
                    target.touch()
                    continue
                tensor, mapping = _mapped(target, size, create=True)
                maps.append(mapping)
                tensors.append(tensor)
                works.append(dist.irecv(tensor, receive_from))
        _wait(works)
    finally:
        del tensors
        for mapping in maps:
            mapping.close()
    if tmp is None or manifest is None or held is None:
        return None
    return commit_received(tmp, manifest, held, step)


def _swap(
    send: torch.Tensor | None, send_to: int | None, into: torch.Tensor, receive_from: int | None
) -> None:
    """Send ``send`` (None: nothing) and receive into ``into`` (from None: nothing), at once."""
    works = []
    if send is not None:
        works.append(dist.isend(send, send_to))
    if receive_from is not None:
        works.append(dist.irecv(into, receive_from))
    _wait(works)


def commit_received(tmp: Path, manifest: dict[str, Any], directory: Path, step: int) -> Path:
    """Check a received copy against the manifest it came with, write that manifest, commit it."""
    atomic_json(tmp / layout.MANIFEST, manifest)
    problem = layout.problem_with(tmp)
    if problem is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"the copy received for step {step} is damaged: {problem}")
    return _commit(tmp, directory, step)


def _header(copy: Path) -> bytes:
    return json.dumps(layout.read_manifest(copy)).encode()


def _files(manifest: dict[str, Any]) -> list[tuple[str, int]]:
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise RuntimeError("a fast-tier copy's manifest lists no files")
    out = []
    for name, entry in sorted(files.items()):
        if Path(name).is_absolute() or ".." in Path(name).parts or "/" in name:
            raise RuntimeError(f"a fast-tier copy names {name!r}, outside the copy")
        out.append((name, int(entry["size"])))
    return out


def _mapped(path: Path, size: int, create: bool) -> tuple[torch.Tensor, mmap.mmap]:
    """The file's bytes as a uint8 tensor over a shared mapping (created at ``size`` when ``create``)."""
    flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=torch.uint8), mapping


def _wait(works: list[Any]) -> None:
    for work in works:
        work.wait()


def send_copy(copy: Path, dst: int, group: dist.ProcessGroup | None) -> None:
    header = _header(copy)
    dist.send(torch.tensor([len(header)], dtype=torch.int64), _global(dst, group), group=group)
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8), _global(dst, group), group=group)
    for name, size in _files(layout.read_manifest(copy)):
        if size:
            tensor, mapping = _mapped(copy / name, size, create=False)
            try:
                dist.send(tensor, _global(dst, group), group=group)
            finally:
                del tensor
                mapping.close()


def receive_copy(tmp: Path, src: int, group: dist.ProcessGroup | None) -> Path:
    length = torch.zeros(1, dtype=torch.int64)
    dist.recv(length, _global(src, group), group=group)
    header = torch.zeros(int(length.item()), dtype=torch.uint8)
    dist.recv(header, _global(src, group), group=group)
    manifest = json.loads(header.numpy().tobytes())
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, size in _files(manifest):
        if not size:
            (tmp / name).touch()
            continue
        tensor, mapping = _mapped(tmp / name, size, create=True)
        try:
            dist.recv(tensor, _global(src, group), group=group)
        finally:
            del tensor
            mapping.close()
    return commit_received(tmp, manifest, tmp.parent, int(manifest["step"]))


def _global(rank: int, group: dist.ProcessGroup | None) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
