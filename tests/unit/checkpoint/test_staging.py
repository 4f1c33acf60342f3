"""Staging (hpctrain.checkpoint.staging): an asynchronous save copies the state into buffers reused from one
save to the next, before the optimizer changes the weights."""

from __future__ import annotations

from concurrent.futures import Future

import torch
from torch import nn

from hpctrain.checkpoint.staging import BufferStager


def test_staging_copies_into_buffers_reused_from_one_save_to_the_next():
    weight = torch.arange(6.0).reshape(2, 3)
    state = {
        "model": {"w": weight, "tied": weight, "t": weight.t()},
        "step": 3,
        "blob": b"x",
        "lst": [weight],
    }
    stager = BufferStager()
    first = stager.stage(state)
    assert torch.equal(first["model"]["w"], weight) and first["model"]["w"].data_ptr() != weight.data_ptr()
    assert first["model"]["tied"] is first["model"]["w"], "tensors sharing memory are staged once"
    assert torch.equal(first["model"]["t"], weight.t()) and first["lst"][0] is first["model"]["w"]
    assert first["step"] == 3 and first["blob"] == b"x"
    weight.add_(1)  # the optimizer changes the weights after staging: the staged copy does not change
    assert torch.equal(first["model"]["w"], torch.arange(6.0).reshape(2, 3))
    second = stager.stage(state)
    assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr(), "buffer reused"
    assert torch.equal(second["model"]["w"], weight)
    stager.close()


def test_overlapped_staging_copies_the_weights_before_the_optimizer_changes_them():
    model = nn.BatchNorm1d(4)  # a buffer (running mean) that a forward changes: copied in stage()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    stager = BufferStager()
    stager.defer_until_step([optimizer])
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moment = optimizer.state[model.weight]["exp_avg"].clone()
    staged = stager.stage(state)
    assert isinstance(staged, Future)  # the weights are copied in the background
    model(torch.randn(8, 4) + 3).sum().backward()  # the next step's forward changes the running mean
    optimizer.step()  # waits for the copy before it changes the weights
    copy = staged.result()
    assert all(torch.equal(copy["model"][k], before[k]) for k in before)
    assert torch.equal(copy["optim"]["state"][0]["exp_avg"], moment)
    assert not torch.equal(model.weight, before["weight"])
    assert not torch.equal(model.running_mean, before["running_mean"])
    stager.close()
