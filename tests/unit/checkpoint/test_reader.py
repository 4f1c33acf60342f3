"""The reader (``hpctrain.checkpoint.reader``): tensors built from the raw bytes of each verified shard,
bitwise; checkpoints written before the raw format still load; a crafted payload is refused, never run; a
shard's bytes reach the state only once the whole shard matched its checksum."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo

from hpctrain.checkpoint.direct import RAW, DirectWriter
from hpctrain.checkpoint.reader import CheckpointDamaged, FastReader
from hpctrain.checkpoint.safe import SafeLoadPlanner, UnsafeCheckpoint
from hpctrain.checkpoint.tiers import read_checkpoint
from hpctrain.rundir import checkpoints as layout

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "w": torch.randn(300, 70),
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "half": torch.randn(7).half(),
        "ints": torch.arange(-5, 6, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "transposed": torch.randn(4, 6).t(),  # not contiguous: stored in C order
        # Large enough to be written from their own memory (direct.OWN_MEMORY), one of an odd length.
        "large": torch.randn(600_000),
        "odd": torch.randint(0, 255, ((1 << 20) + 3,), dtype=torch.uint8),
        "values": {"step": 7, "name": "run", "floats": [1.5, 2.5]},
    }


def _blank(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (
            torch.zeros_like(v, memory_format=torch.contiguous_format)
            if isinstance(v, torch.Tensor)
            else {"step": 0, "name": "", "floats": [0.0, 0.0]}
        )
        for k, v in state.items()
    }


def _save(directory: Path, state: dict[str, Any], writer: Any = None) -> Path:
    dcp.save(state, storage_writer=writer or DirectWriter(directory), no_dist=True)
    layout.write_manifest(directory, 1)
    return directory


def _load(directory: Path, state: dict[str, Any]) -> FastReader:
    reader = FastReader(directory)
    dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return reader


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _assert_bitwise(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == b[key].dtype and value.shape == b[key].shape, key
            assert torch.equal(_bytes(value), _bytes(b[key])), key
        else:
            assert value == b[key], key


def test_every_dtype_and_shape_round_trips_bitwise(tmp_path: Path) -> None:
    state = _state()
    directory = _save(tmp_path / "c", state)
    info = [s for s in _metadata(directory).storage_data.values() if s.transform_descriptors]
    assert info and all(s.transform_descriptors == [RAW] and s.offset % 64 == 0 for s in info)
    loaded = _blank(state)
    reader = _load(directory, loaded)
    _assert_bitwise(state, loaded)
    assert reader.touched
    whole = read_checkpoint(directory)  # the same reader, the state built from the metadata
    _assert_bitwise({k: v for k, v in state.items() if k != "transposed"}, whole)


def test_a_checkpoint_of_torch_save_records_still_loads(tmp_path: Path) -> None:
    state = _state()
    directory = _save(tmp_path / "c", state, FileSystemWriter(tmp_path / "c"))  # DCP's own format
    assert not any(s.transform_descriptors for s in _metadata(directory).storage_data.values())
    loaded = _blank(state)
    _load(directory, loaded)
    _assert_bitwise(state, loaded)


class _Exploit:
    """What a crafted value would hold: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _metadata(directory: Path) -> Any:
    with open(directory / ".metadata", "rb") as f:
        return pickle.load(f)  # the test's own file: trusted here


def _point(directory: Path, fqn: str, payload: bytes | None, **changes: Any) -> None:
    """Rewrite the checkpoint as an attacker would: ``fqn``'s stored entry points at ``payload`` (appended to
    the shard) and/or has ``changes``; the manifest is rewritten to match."""
    metadata = _metadata(directory)
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info: _StorageInfo = metadata.storage_data[index]
    if payload is not None:
        shard = directory / info.relative_path
        offset = shard.stat().st_size
        with open(shard, "ab") as f:
            f.write(payload)
        info = dataclasses.replace(info, offset=offset, length=len(payload))
    metadata.storage_data[index] = dataclasses.replace(info, **changes)
    with open(directory / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    layout.write_manifest(directory, 1)


def _exploit_payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"x": _Exploit(marker)}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("target", ["a value", "a tensor read as a torch.save record"])
def test_a_crafted_payload_is_refused_and_never_run(tmp_path: Path, target: str) -> None:
    state = _state()
    directory = _save(tmp_path / "c", state)
    marker = tmp_path / "pwned"
    if target == "a value":
        _point(directory, "values.step", _exploit_payload(marker))
    else:  # the raw marker dropped: the reader takes the bytes for a torch.save record
        _point(directory, "w", _exploit_payload(marker), transform_descriptors=None)
    with pytest.raises(BaseException) as caught:
        _load(directory, _blank(state))
    assert not marker.exists(), "the checkpoint's pickle ran"
    failure = (
        next(iter(caught.value.failures.values()))[0] if hasattr(caught.value, "failures") else caught.value
    )
    assert isinstance(failure, UnsafeCheckpoint) and "weights-only" in str(failure)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"transform_descriptors": ["zstd/1"]}, "stored as zstd/1, which hpctrain does not read"),
        ({"offset": 1 << 40}, "lies outside the file"),
        ({"length": 12}, "12 bytes stored, the metadata says [300, 70]"),
    ],
)
def test_a_stored_entry_that_does_not_fit_is_refused(
    tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    state = _state()
    directory = _save(tmp_path / "c", state)
    _point(directory, "w", None, **changes)
    with pytest.raises(BaseException) as caught:
        _load(directory, _blank(state))
    failure = next(iter(caught.value.failures.values()))[0]
    assert isinstance(failure, CheckpointDamaged) and says in str(failure)


def test_no_byte_of_a_damaged_shard_reaches_the_state(tmp_path: Path) -> None:
    """Two shards: the first verifies and is copied; the second has a flipped bit and is not; the reader
    says the state was touched (the manager then overwrites it or builds it anew)."""
    first, second = {"a": torch.randn(1000)}, {"b": torch.randn(1000)}
    directory = _two_shards(tmp_path, first, second)
    shard = directory / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    state = {"a": torch.zeros(1000), "b": torch.zeros(1000)}
    reader = FastReader(directory)
    with pytest.raises(BaseException) as caught:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    failure = next(iter(caught.value.failures.values()))[0]
    assert isinstance(failure, CheckpointDamaged) and "__1_0.distcp does not match its checksum" in str(
        failure
    )
    assert torch.equal(state["a"], first["a"]) and reader.touched
    assert torch.equal(state["b"], torch.zeros(1000)), "the damaged shard's bytes were copied"

    only = _save(tmp_path / "one", {"c": torch.randn(1000)})
    shard = only / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01
    shard.write_bytes(bytes(data))
    untouched = {"c": torch.zeros(1000)}
    reader = FastReader(only)
    with pytest.raises(BaseException, match="does not match its checksum"):
        dcp.load(untouched, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    assert not reader.touched and torch.equal(untouched["c"], torch.zeros(1000))


def _two_shards(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> Path:
    """A checkpoint of two shard files (as two ranks write), made from two one-process saves."""
    a, b = _save(tmp_path / "a", first), _save(tmp_path / "b", second)
    (b / "__0_0.distcp").rename(a / "__1_0.distcp")
    meta_a, meta_b = _metadata(a), _metadata(b)
    meta_a.state_dict_metadata.update(meta_b.state_dict_metadata)
    for index, info in meta_b.storage_data.items():
        meta_a.storage_data[index] = dataclasses.replace(info, relative_path="__1_0.distcp")
    with open(a / ".metadata", "wb") as f:
        pickle.dump(meta_a, f)
    layout.write_manifest(a, 1)
    return a


def test_a_resume_unpickles_the_metadata_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager reads the metadata before ``dcp.load`` and DCP reads it again: one reader unpickles it
    once (0.09 s of a 120M GPT's resume), and what DCP gets names this load."""
    from hpctrain.checkpoint import safe
    from hpctrain.checkpoint.manager import CheckpointManager

    state = {"w": torch.randn(50, 20), "b": torch.randn(20)}
    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=1, rank=0)
    manager.save(3, state)
    calls: list[int] = []
    real = safe.load_metadata
    monkeypatch.setattr(safe, "load_metadata", lambda data: calls.append(len(data)) or real(data))
    loaded = {"w": torch.zeros(50, 20), "b": torch.zeros(20)}
    assert manager.resume(loaded, "auto") is not None
    manager.close()
    assert len(calls) == 1
    _assert_bitwise(state, loaded)

    reader = FastReader(tmp_path / "checkpoints" / "step_00000003")
    first = reader.read_metadata()
    reader.reset()  # as DCP does at the start of a load: a new load id
    assert reader.read_metadata() is first and first.storage_meta.load_id == reader.load_id
