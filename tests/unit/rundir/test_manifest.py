"""Manifest version 3 (CRC-32C): versions 1 and 2 still verify, a newer one is refused in one line."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from hpctrain.rundir import checkpoints as layout


def _checkpoint(tmp_path: Path) -> Path:
    directory = tmp_path / "step_00000001"
    directory.mkdir()
    (directory / "__0_0.distcp").write_bytes(bytes(range(256)) * 400)
    (directory / ".metadata").write_bytes(b"meta")
    return directory


def test_version_3_records_crc32c_and_catches_a_flipped_bit(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path)
    manifest = layout.write_manifest(directory, 1, lineage="abc")
    assert manifest["version"] == 3 == layout.MANIFEST_VERSION
    entry = manifest["files"]["__0_0.distcp"]
    assert entry == {"size": 102400, "crc32c": layout.crc32c(directory / "__0_0.distcp")}
    assert layout.problem_with(directory) is None
    shard = directory / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0x10
    shard.write_bytes(bytes(data))
    assert layout.problem_with(directory, checksums=False) is None  # same size: only the checksum sees it
    assert layout.problem_with(directory) == (
        "__0_0.distcp does not match its checksum (the file changed after it was written)"
    )


def test_versions_1_and_2_still_verify(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path)
    files = {p.name: p for p in directory.iterdir()}
    entries = {n: {"size": p.stat().st_size, "crc32": zlib.crc32(p.read_bytes())} for n, p in files.items()}
    v2 = {"version": 2, "step": 1, "files": entries}
    (directory / layout.MANIFEST).write_text(json.dumps(v2))
    assert layout.problem_with(directory) is None
    v2["files"]["__0_0.distcp"]["crc32"] ^= 1
    (directory / layout.MANIFEST).write_text(json.dumps(v2))
    assert "does not match its checksum" in str(layout.problem_with(directory))
    v1 = {"step": 1, "files": {n: p.stat().st_size for n, p in files.items()}}  # no version: sizes only
    (directory / layout.MANIFEST).write_text(json.dumps(v1))
    assert layout.problem_with(directory) is None


def test_a_version_3_entry_must_carry_crc32c(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path)
    manifest = layout.write_manifest(directory, 1)
    manifest["files"]["__0_0.distcp"] = {"size": 102400, "crc32": 1}  # version 2's key under version 3
    (directory / layout.MANIFEST).write_text(json.dumps(manifest))
    assert layout.problem_with(directory) == "manifest.json has an entry for __0_0.distcp of the wrong shape"


@pytest.mark.parametrize("version", [4, 99])
def test_a_newer_manifest_is_refused_in_one_line(tmp_path: Path, version: int) -> None:
    directory = _checkpoint(tmp_path)
    manifest = layout.write_manifest(directory, 1)
    manifest["version"] = version
    (directory / layout.MANIFEST).write_text(json.dumps(manifest))
    problem = layout.problem_with(directory)
    assert problem is not None and "\n" not in problem
    assert f"version {version}, newer than this hpctrain reads (1-3)" in problem


def test_an_older_reader_refuses_version_3_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _checkpoint(tmp_path)
    layout.write_manifest(directory, 1)
    monkeypatch.setattr(layout, "MANIFEST_VERSION", 2)  # a reader that knows versions 1 and 2
    problem = layout.problem_with(directory)
    assert problem == (
        "manifest.json is version 3, newer than this hpctrain reads (1-2): written by a newer hpctrain; "
        "load it with that one"
    )


@pytest.mark.parametrize("version", ['"3"', "0", "true", "null"])
def test_a_version_of_the_wrong_kind_is_a_problem_not_a_crash(tmp_path: Path, version: str) -> None:
    directory = _checkpoint(tmp_path)
    layout.write_manifest(directory, 1)
    text = (directory / layout.MANIFEST).read_text().replace('"version": 3', f'"version": {version}')
    (directory / layout.MANIFEST).write_text(text)
    problem = layout.problem_with(directory)
    assert problem is not None and "version" in problem and "\n" not in problem
