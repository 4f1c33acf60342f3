"""The object tier (hpctrain.checkpoint.objects) in one process, over fsspec's in-process memory store: a save
is committed by its manifest, written last; resume loads the newest committed bitwise and removes what
never committed; pruning and a same-step checkpoint of another lineage never lose a committed checkpoint."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.objects import ObjectTier
from hpctrain.checkpoint.state import TrainState
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import ObjectDir, Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Weights:
    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.tensors = {"w": torch.randn(300, 7), "b": torch.randn(7).to(torch.bfloat16)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self.tensors[key].copy_(value)


def state(seed: int, step: int = 0) -> dict[str, object]:
    return {"model": Weights(seed), "train": TrainState(step=step)}


@pytest.fixture
def tier() -> ObjectTier:
    url = f"memory://ckpt-{uuid.uuid4().hex[:8]}/run"
    return ObjectTier(ObjectDir.at(url), Store(url, {}))


def manager(tmp_path: Path, tier: ObjectTier, keep_last: int = 2) -> CheckpointManager:
    return CheckpointManager(tmp_path / "checkpoints", keep_last=keep_last, rank=0, tier=tier)


def saved_twice(tmp_path: Path, tier: ObjectTier) -> None:
    first = manager(tmp_path, tier)
    first.save(5, state(1, step=5))
    first.save(10, state(1, step=10))
    first.close()


def test_a_save_is_committed_by_its_manifest_and_resumes_bitwise(tmp_path: Path, tier: ObjectTier) -> None:
    saved = state(1, step=5)
    first = manager(tmp_path, tier)
    assert first.save(5, saved) == tier.root / "step_00000005"
    first.close()
    manifest = layout.read_manifest(tier.root / "step_00000005")
    assert manifest["step"] == 5 and manifest["lineage"] == first.lineage
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp"]  # the writers' checksum records gone
    assert [p.name for p in (tier.root / "step_00000005").iterdir()] == [
        ".metadata",
        "__0_0.distcp",
        "manifest.json",
    ]

    fresh = state(2)
    again = manager(tmp_path, tier)
    assert again.resume(fresh, "auto") == tier.root / "step_00000005"
    assert fresh["train"].step == 5
    assert all(torch.equal(fresh["model"].tensors[k], saved["model"].tensors[k]) for k in ("w", "b"))
    again.close()


def test_a_save_that_never_committed_is_never_loaded_and_goes_at_resume(
    tmp_path: Path, tier: ObjectTier, caplog: pytest.LogCaptureFixture
) -> None:
    saved_twice(tmp_path, tier)
    (tier.root / "step_00000010" / layout.MANIFEST).fs.rm_file(
        (tier.root / "step_00000010" / layout.MANIFEST).key
    )
    assert [c.name for c in layout.committed(tier.root)] == ["step_00000005"]
    fresh = state(3)
    with caplog.at_level(logging.INFO, logger="hpctrain.checkpoint.manager"):
        assert manager(tmp_path, tier).resume(fresh, "auto") == tier.root / "step_00000005"
    assert "Removing step_00000010: a checkpoint that was never committed" in caplog.text
    assert not (tier.root / "step_00000010").exists()


def test_a_damaged_object_is_skipped_for_the_one_before(
    tmp_path: Path, tier: ObjectTier, caplog: pytest.LogCaptureFixture
) -> None:
    saved_twice(tmp_path, tier)
    shard = tier.root / "step_00000010" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    fresh = state(3)
    with caplog.at_level(logging.WARNING, logger="hpctrain.checkpoint.manager"):
        assert manager(tmp_path, tier).resume(fresh, "auto") == tier.root / "step_00000005"
    assert "__0_0.distcp does not match its checksum" in caplog.text and fresh["train"].step == 5


def test_pruning_and_another_lineages_step_never_lose_a_committed_checkpoint(
    tmp_path: Path, tier: ObjectTier, caplog: pytest.LogCaptureFixture
) -> None:
    ours = manager(tmp_path, tier, keep_last=2)
    for step in (5, 10, 15):
        ours.save(step, state(1, step=step))
    ours.close()
    assert [c.name for c in layout.committed(tier.root)] == ["step_00000015", "step_00000010"]
    assert not (tier.root / "step_00000005").exists()  # its manifest first, then the rest

    # A fresh lineage (resume=never) saving step 10: the other lineage's step 10 is moved aside whole.
    other = manager(tmp_path, tier, keep_last=5)
    other.resume(state(4), "never")
    with caplog.at_level(logging.WARNING, logger="hpctrain.checkpoint.manager"):
        other.save(10, state(4, step=10))
    other.close()
    aside = [p for p in tier.root.iterdir() if p.name.startswith("step_00000010.lineage-")]
    assert len(aside) == 1 and "this run did not write it (another run's lineage)" in caplog.text
    assert layout.problem_with(aside[0]) is None  # whole, its manifest copied last
    assert layout.lineage_of(tier.root / "step_00000010") == other.lineage
    assert layout.lineage_of(tier.root / "step_00000015") == ours.lineage  # never pruned by the other
