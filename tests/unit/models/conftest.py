"""Tiny models' training steps on one thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    # Tiny models gain nothing from intra-op threads, and on a shared 2-core machine their spin-waits make
    # these steps several times slower under load.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
