"""Loading a checkpoint never runs code from it.

A DCP checkpoint holds two kinds of pickles: ``.metadata`` (read by ``FileSystemReader.read_metadata`` with a
plain ``pickle.load``) and the non-tensor values of the state (read by ``DefaultLoadPlanner.load_bytes`` with
``torch.load(weights_only=False)``). Either could run arbitrary code from a crafted file in a run directory,
and auto-resume loads whatever is there. Here:

- :class:`SafeFileSystemReader` unpickles ``.metadata`` with an allow-list of the classes DCP's metadata is
  made of (its dataclasses, ``torch.Size``, dtypes, layouts, memory formats, paths), nothing else;
- :class:`SafeLoadPlanner` reads values with ``torch.load(weights_only=True)``;
- :func:`encode` / :func:`decode` turn state that has numpy arrays or tuples (RNG states, PowerSGD's
  per-bucket tensors) into bytes that the weights-only unpickler reads, instead of ``pickle.dumps``.

A file that needs anything else is refused with :class:`UnsafeCheckpoint`, naming what it asked for.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hpctrain import torchapi
from hpctrain.torchapi import EmptyStateDictLoadPlanner

# Modules whose classes DCP's metadata is made of (dataclasses and enums, no code on construction).
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch", "Size"): torch.Size,
    **torchapi.METADATA_PICKLE_NAMES,
    ("pathlib", "PosixPath"): __import__("pathlib").PosixPath,
    ("pathlib", "WindowsPath"): __import__("pathlib").PureWindowsPath,
    # Python 3.13 made pathlib a package: its paths pickle as pathlib._local.*. Named here, never imported, so
    # a checkpoint written on 3.13 loads on 3.10-3.12 as well.
    ("pathlib._local", "PosixPath"): __import__("pathlib").PosixPath,
    ("pathlib._local", "WindowsPath"): __import__("pathlib").PureWindowsPath,
    ("collections", "OrderedDict"): __import__("collections").OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class UnsafeCheckpoint(ValueError):
    """A checkpoint file asks for something loading must not do."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Decide before importing anything: importing a module can itself run code.
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        if module in _METADATA_MODULES and not name.startswith("__"):
            found = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(found, type):
                return found
        raise UnsafeCheckpoint(f".metadata asks for {module}.{name}, which a checkpoint never holds")


def load_metadata(data: bytes) -> Metadata:
    """DCP metadata from the bytes of a ``.metadata`` file, through the allow-list."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as err:
        raise UnsafeCheckpoint(f".metadata is not DCP metadata: {type(err).__name__}: {err}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f".metadata holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    def metadata_bytes(self, rank: int | None) -> bytes:
        """The bytes of DCP's ``.metadata`` (for ``rank``: DCP's per-rank name where it uses one)."""
        path = torchapi.metadata_path(self, rank)
        with self.fs.create_stream(path, "rb") as stream:
            return bytes(stream.read())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = load_metadata(self.metadata_bytes(kwargs.get("rank")))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Each value read weights-only (tensors and plain data), where DCP's planner would unpickle it."""
        loaded = weights_only(read_item, value)
        if self.flatten_state_dict:
            torchapi.set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class SafeEmptyStatePlanner(EmptyStateDictLoadPlanner):
    """DCP's planner that builds the whole state from the metadata (for reading a checkpoint into one
    process), reading values weights-only."""

    load_bytes = SafeLoadPlanner.load_bytes  # both are DefaultLoadPlanners: the same state, the same read


_PLAIN = (bool, int, float, str, type(None))
_decoded: dict[bytes, Any] = {}


def weights_only(read_item: ReadItem, value: io.BytesIO) -> Any:
    """A value of a checkpoint (DCP's ``torch.save`` bytes), unpickled weights-only or refused. A flattened
    optimizer state repeats each option per parameter (2,156 values for GPT-2 small, a second of torch.load
    on a busy machine): the same small bytes that gave a plain, immutable value are decoded once."""
    data = value.getvalue()
    if len(data) <= 4096 and data in _decoded:
        return _decoded[data]
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if len(data) <= 4096 and (
            isinstance(loaded, _PLAIN)
            or (isinstance(loaded, tuple) and all(isinstance(v, _PLAIN) for v in loaded))
        ):
            if len(_decoded) > 4096:
                _decoded.clear()
            _decoded[data] = loaded
        return loaded
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UnsafeCheckpoint(
            f"{read_item.dest_index.fqn}: refused by the weights-only loader: {first}"
        ) from None


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj)), "dtype": str(obj.dtype)}
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_plain(x) for x in obj]}
    if isinstance(obj, list):
        return [_to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return obj["__ndarray__"].numpy().astype(obj["dtype"], copy=False)
        if "__tuple__" in obj:
            return tuple(_from_plain(x) for x in obj["__tuple__"])
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_plain(x) for x in obj]
    return obj


def encode(obj: Any) -> bytes:
    """Bytes of a structure of tensors, numpy arrays, numbers, strings, tuples, lists and dicts that
    :func:`decode` reads back with the weights-only unpickler."""
    out = io.BytesIO()
    torch.save(_to_plain(obj), out)
    return out.getvalue()


def decode(data: bytes) -> Any:
    try:
        return _from_plain(torch.load(io.BytesIO(data), weights_only=True))
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpoint(f"refused by the weights-only loader: {str(err).splitlines()[0]}") from None
