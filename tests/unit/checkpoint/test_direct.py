"""Shards written past the page cache (``hpctrain.checkpoint.direct``): the bytes on disk are the bytes
written, whatever sizes the writes come in, and the CRC-32C the writer records is the file's, which the
manifest takes instead of reading the checkpoint back; a record that no longer fits its file is not used."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint import direct
from hpctrain.checkpoint.direct import DirectWriter, ShardStream
from hpctrain.checkpoint.reader import FastReader
from hpctrain.checkpoint.safe import SafeLoadPlanner
from hpctrain.rundir import checkpoints as layout

# Sizes around the 4 KiB block and the 16 MiB buffer: a tail to pad, a buffer filled exactly, one overrun.
SIZES = [0, 1, 4095, 4096, 4097, direct.BUFFER - 3, 3, direct.BUFFER, 5 * 4096 + 17]


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_a_shard_holds_exactly_what_was_written_with_its_checksum_beside_it(tmp_path: Path, where: str):
    if where == "tmpfs":  # no O_DIRECT there: the same stream writes through the page cache
        if not Path("/dev/shm").is_dir():
            pytest.skip("no /dev/shm on this machine")
        base = Path("/dev/shm") / f"hpctrain-direct-{os.getpid()}"
        base.mkdir()
    else:
        base = tmp_path
    try:
        data = os.urandom(sum(SIZES))
        path = base / "__0_0.distcp"
        stream = ShardStream(path)
        offset = 0
        for i, size in enumerate(SIZES):
            piece = memoryview(data)[offset : offset + size]
            if i % 2:  # bytes (DCP's values) and tensors (raw) alike
                assert stream.write(piece) == size
            else:
                tensor = torch.frombuffer(bytearray(piece), dtype=torch.uint8) if size else torch.empty(0)
                assert stream.write_tensor(tensor) == size
            offset += size
            assert stream.tell() == offset
        stream.close()
        assert path.read_bytes() == data
        record = json.loads((base / "__0_0.distcp.crc32c").read_text())
        assert record == {"size": len(data), "crc32c": layout.checksum(data)}
        if where == "disk":
            assert stream.direct == hasattr(os, "O_DIRECT")
    finally:
        if where == "tmpfs":
            for p in base.iterdir():
                p.unlink()
            base.rmdir()


def test_the_manifest_takes_recorded_checksums_and_checks_the_rest(tmp_path: Path):
    state = {"w": torch.arange(10_000, dtype=torch.float32), "b": torch.ones(3)}
    dcp.save(state, storage_writer=DirectWriter(tmp_path), no_dist=True)
    shard = tmp_path / "__0_0.distcp"
    record = json.loads((tmp_path / "__0_0.distcp.crc32c").read_text())
    assert record["crc32c"] == layout.crc32c(shard)

    layout.write_manifest(tmp_path, 1)
    files = layout.read_manifest(tmp_path)["files"]
    assert set(files) == {"__0_0.distcp", ".metadata"}  # the records are consumed, not listed
    assert files["__0_0.distcp"]["crc32c"] == record["crc32c"]
    assert files[".metadata"]["crc32c"] == layout.crc32c(tmp_path / ".metadata")
    assert layout.problem_with(tmp_path) is None
    loaded = {"w": torch.zeros(10_000), "b": torch.zeros(3)}
    dcp.load(loaded, storage_reader=FastReader(tmp_path), planner=SafeLoadPlanner(), no_dist=True)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_a_record_that_does_not_fit_its_file_is_not_trusted(tmp_path: Path):
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(b"x" * 100)
    layout.write_checksum(shard, 99, 12345)  # another size: the file changed after it was recorded
    layout.write_manifest(tmp_path, 1)
    assert layout.read_manifest(tmp_path)["files"]["__0_0.distcp"]["crc32c"] == layout.checksum(b"x" * 100)
    assert layout.problem_with(tmp_path) is None


def test_a_failed_write_records_no_checksum(tmp_path: Path):

    def fail(_: int) -> None:
        raise RuntimeError("disk full")

    state = {"a": torch.ones(4 << 20), "b": torch.ones(3)}
    with pytest.raises(BaseException, match="disk full"):
        dcp.save(state, storage_writer=DirectWriter(tmp_path, progress=fail), no_dist=True)
    assert not (tmp_path / "__0_0.distcp.crc32c").exists()
    assert not (tmp_path / ".metadata").exists()


def test_a_file_system_that_refuses_direct_writes_gets_buffered_ones(tmp_path: Path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_write, refused = os.write, []

    def write(fd: int, data: object) -> int:  # the first O_DIRECT write is refused, as by a 64 KiB-block FS
        if not refused and os.get_blocking(fd) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct.os, "write", write)
    data = os.urandom(direct.BUFFER + 1000)
    stream = ShardStream(tmp_path / "__0_0.distcp")
    assert stream.direct
    stream.write(data)
    stream.close()
    assert refused and not stream.direct
    assert (tmp_path / "__0_0.distcp").read_bytes() == data
