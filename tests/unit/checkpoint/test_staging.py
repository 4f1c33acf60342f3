"""Staging (hpctrain.checkpoint.staging): an asynchronous save copies the state into buffers reused from one
save to the next, before the optimizer changes the weights."""

from __future__ import annotations

import io
import threading
from concurrent.futures import Future

import torch
from torch import nn

from hpctrain.checkpoint.staging import SegmentStager, Staged


def _staged_tensor(staged: Staged, name: str) -> torch.Tensor:
    slot = staged.slots[name]
    return staged.segment[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)


def test_staging_copies_into_a_shared_segment_reused_from_one_save_to_the_next():
    weight = torch.arange(6.0).reshape(2, 3)
    state = {"model": {"w": weight, "tied": weight, "t": weight.t()}, "step": 3, "blob": b"x"}
    stager = SegmentStager()
    done: list[Staged] = []
    first = stager.stage(state, is_coordinator=True, then=lambda staged, err: done.append(staged))
    assert done == [first] and first.segment.is_shared()
    assert torch.equal(_staged_tensor(first, "model.w"), weight)
    assert first.slots["model.tied"] == first.slots["model.w"], "tensors sharing memory are staged once"
    assert torch.equal(_staged_tensor(first, "model.t"), weight.t())
    assert torch.load(io.BytesIO(first.blobs["step"]), weights_only=True) == 3
    assert torch.load(io.BytesIO(first.blobs["blob"]), weights_only=True) == b"x"
    weight.add_(1)  # the optimizer changes the weights after staging: the staged copy does not change
    assert torch.equal(_staged_tensor(first, "model.w"), torch.arange(6.0).reshape(2, 3))
    second = stager.stage(state, is_coordinator=True, then=lambda staged, err: done.append(staged))
    assert second.segment.data_ptr() == first.segment.data_ptr() and second.layout == first.layout, "reused"
    assert torch.equal(_staged_tensor(second, "model.w"), weight)
    stager.close()


def test_overlapped_staging_copies_the_weights_before_the_optimizer_changes_them():
    model = nn.BatchNorm1d(4)  # a buffer (running mean) that a forward changes: copied in stage()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    stager = SegmentStager()
    stager.defer_until_step([optimizer])
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moment = optimizer.state[model.weight]["exp_avg"].clone()
    copied: Future = Future()
    threads: list[str] = []

    def then(staged: Staged | None, err: BaseException | None) -> None:
        threads.append(threading.current_thread().name)
        copied.set_result(staged)

    stager.stage(state, is_coordinator=True, then=then)
    model(torch.randn(8, 4) + 3).sum().backward()  # the next step's forward changes the running mean
    optimizer.step()  # waits for the copy before it changes the weights
    copy = copied.result()
    assert threads == ["hpctrain-stage"], "the weights are copied in the background"
    assert all(torch.equal(_staged_tensor(copy, f"model.{k}"), before[k]) for k in before)
    assert torch.equal(_staged_tensor(copy, "optim.state.0.exp_avg"), moment)
    assert not torch.equal(model.weight, before["weight"])
    assert not torch.equal(model.running_mean, before["running_mean"])
    stager.close()
