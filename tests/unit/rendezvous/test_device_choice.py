"""Which device and backend a rank takes: the decision init_distributed follows (its torch.cuda.set_device
and NCCL group run on GPUs in tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.rendezvous.group import device_for


def test_each_local_rank_takes_its_own_gpu_and_nccl() -> None:
    assert device_for(0, 0) == (torch.device("cpu"), "gloo")
    assert device_for(3, 0) == (torch.device("cpu"), "gloo")  # no GPU: every rank on the CPU
    assert device_for(0, 8) == (torch.device("cuda", 0), "nccl")
    assert device_for(5, 8) == (torch.device("cuda", 5), "nccl")  # local rank, not global rank


def test_more_local_ranks_than_gpus_is_one_line() -> None:
    with pytest.raises(RuntimeError, match=r"^local rank 4 has no GPU: this node has 4 \(run at most"):
        device_for(4, 4)
