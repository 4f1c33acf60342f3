"""A store's prefix read as a folder (hpctrain.rundir.objects), over fsspec's in-process memory store: the
listing finds only committed checkpoints, the run directory records where they are."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import (
    ObjectDir,
    Patient,
    Store,
    StoreTimeout,
    is_url,
    record_store,
    recorded_store,
    shared_root,
)


@pytest.fixture
def root() -> ObjectDir:
    return ObjectDir.at(f"memory://bucket-{uuid.uuid4().hex[:8]}/runs/a")


def test_an_object_prefix_reads_like_a_folder(root: ObjectDir) -> None:
    (root / "step_00000005" / "x.bin").write_bytes(b"12345")
    step = root / "step_00000005"
    assert step.name == "step_00000005" and step.parent == root and str(step).startswith("memory://")
    assert step.is_dir() and not step.is_file() and step.exists() and not step.is_symlink()
    assert (step / "x.bin").is_file() and (step / "x.bin").stat().st_size == 5
    assert (step / "x.bin").read_text() == "12345" and (step / "x.bin").open("rb").read() == b"12345"
    assert [p.name for p in root.iterdir()] == ["step_00000005"]
    assert not (step / "missing").exists() and list((root / "nothing").iterdir()) == []
    with pytest.raises(FileNotFoundError):
        (step / "missing").stat()
    with pytest.raises(ValueError, match="the object tier writes"):
        (step / "x.bin").open("wb")


def test_only_a_prefix_with_a_manifest_is_a_committed_checkpoint(root: ObjectDir) -> None:
    for step in (5, 10, 15):
        (root / layout.checkpoint_name(step) / "__0_0.distcp").write_bytes(b"\0" * 8)
    for step in (5, 10):  # step 15: written, never committed
        (root / layout.checkpoint_name(step) / layout.MANIFEST).write_bytes(
            json.dumps(
                {"version": 3, "step": step, "files": {"__0_0.distcp": {"size": 8, "crc32c": 0}}}
            ).encode()
        )
    (root / "step_00000010.lineage-x" / layout.MANIFEST).write_bytes(b"{}")  # moved aside: not a candidate
    assert [c.name for c in layout.committed(root)] == ["step_00000010", "step_00000005"]
    assert layout.problem_with(root / "step_00000010", checksums=False) is None
    assert layout.problem_with(root / "step_00000010") == (
        "__0_0.distcp does not match its checksum (the file changed after it was written)"
    )
    assert layout.problem_with(root / "step_00000015") == "no manifest.json (never committed)"
    (root / "step_00000005" / "__0_0.distcp").write_bytes(b"\0" * 7)
    assert layout.problem_with(root / "step_00000005") == "__0_0.distcp has 7 bytes, the manifest says 8"


def test_the_run_directory_records_its_store_without_secrets(tmp_path: Path, root: ObjectDir) -> None:
    run = RunDir(tmp_path / "run")
    assert recorded_store(run.checkpoints) is None and run.shared_checkpoints == run.checkpoints
    record_store(run.checkpoints, Store(str(root), {"endpoint_url": "http://127.0.0.1:9000"}))
    assert recorded_store(run.checkpoints) == Store(
        str(root), {"endpoint_url": "http://127.0.0.1:9000"}, 300.0
    )
    assert shared_root(run.checkpoints) == run.shared_checkpoints == root
    (run.checkpoints / "store.json").write_text("[not a record")  # damaged: read as no store
    assert recorded_store(run.checkpoints) is None
    assert is_url("s3://b/p") and not is_url("/shared/ckpt") and not is_url(None)


def test_a_call_of_the_store_that_does_not_return_fails_within_its_bound() -> None:
    class Stuck:
        def put(self, key: str) -> None:
            time.sleep(30)

        def get(self, key: str) -> str:
            raise FileNotFoundError(key)

        def open(self, key: str) -> Stuck:
            return self

    patient = Patient(Stuck(), timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(
        StoreTimeout, match=r"did not finish put within 0\.2 s \(checkpoint\.store_timeout_s\)"
    ):
        patient.put("k")
    assert time.monotonic() - started < 5
    with pytest.raises(FileNotFoundError):  # the store's own errors pass as they are
        patient.get("k")
    with pytest.raises(StoreTimeout):  # and so are the files it opens
        patient.open("k").put("k")
