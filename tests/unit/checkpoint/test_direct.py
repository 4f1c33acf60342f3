"""Shards written past the page cache (``hpctrain.checkpoint.direct``): the bytes on disk are the bytes
written, whatever sizes the writes come in, and the CRC-32 the writer records is the file's, which the
manifest takes instead of reading the checkpoint back; a record that no longer fits its file is not used."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.checkpoint import direct
from hpctrain.checkpoint.direct import DirectWriter, _DirectStream
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
        stream = _DirectStream(path)
        offset = 0
        for size in SIZES:
            assert stream.write(memoryview(data)[offset : offset + size]) == size
            offset += size
            assert stream.tell() == offset
            stream.flush()  # DCP flushes after each tensor: nothing may go out unaligned
        stream.close()
        assert path.read_bytes() == data
        record = json.loads((base / "__0_0.distcp.crc32").read_text())
        assert record == {"size": len(data), "crc32": zlib.crc32(data)}
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
    record = json.loads((tmp_path / "__0_0.distcp.crc32").read_text())
    assert record["crc32"] == layout.crc32(shard)

    layout.write_manifest(tmp_path, 1)
    files = layout.read_manifest(tmp_path)["files"]
    assert set(files) == {"__0_0.distcp", ".metadata"}  # the records are consumed, not listed
    assert files["__0_0.distcp"]["crc32"] == record["crc32"]
    assert files[".metadata"]["crc32"] == layout.crc32(tmp_path / ".metadata")
    assert layout.problem_with(tmp_path) is None
    loaded = {"w": torch.zeros(10_000), "b": torch.zeros(3)}
    dcp.load(loaded, checkpoint_id=tmp_path, no_dist=True)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_a_record_that_does_not_fit_its_file_is_not_trusted(tmp_path: Path):
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(b"x" * 100)
    layout.write_checksum(shard, 99, 12345)  # another size: the file changed after it was recorded
    layout.write_manifest(tmp_path, 1)
    assert layout.read_manifest(tmp_path)["files"]["__0_0.distcp"]["crc32"] == zlib.crc32(b"x" * 100)
    assert layout.problem_with(tmp_path) is None


def test_a_failed_write_records_no_checksum(tmp_path: Path):
    fs = direct._ShardFileSystem()
    with pytest.raises(RuntimeError), fs.create_stream(tmp_path / "__0_0.distcp", "wb") as stream:
        stream.write(b"partial")
        raise RuntimeError("disk full")
    assert not (tmp_path / "__0_0.distcp.crc32").exists()


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
    stream = _DirectStream(tmp_path / "__0_0.distcp")
    assert stream.direct
    stream.write(data)
    stream.close()
    assert refused and not stream.direct
    assert (tmp_path / "__0_0.distcp").read_bytes() == data
