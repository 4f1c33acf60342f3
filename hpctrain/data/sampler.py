"""Which samples each step trains on, independent of how many ranks share the step.

The index stream is the concatenation of per-epoch permutations (epoch e shuffled by
``default_rng((seed, e))``); global batch k is stream positions ``[k·G, (k+1)·G)``. The sampler's only
state is the number of global samples consumed, so a run resumed on a different data-parallel size (or with
a different global batch size) continues at the very next sample: nothing skipped, nothing repeated, and a
batch may straddle an epoch boundary rather than dropping the epoch's tail.

Numpy only (no torch): ``state_dict``/``load_state_dict`` follow torch.distributed.checkpoint's Stateful
protocol by shape alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class GlobalBatchSampler:
    def __init__(self, num_samples: int, global_batch_size: int, seed: int) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples} must be at least 1")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size={global_batch_size} must be at least 1")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.consumed = 0  # global samples handed out so far, across all epochs
        self._cached_epoch = -1
        self._cached_perm = np.empty(0, dtype=np.int64)

    @property
    def epoch(self) -> int:
        """The epoch the next sample comes from."""
        return self.consumed // self.num_samples

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._cached_epoch:
            rng = np.random.default_rng((self.seed, epoch))
            self._cached_perm = rng.permutation(self.num_samples).astype(np.int64)
            self._cached_epoch = epoch
        return self._cached_perm

    def next_global_batch(self) -> np.ndarray:
        """The next ``global_batch_size`` sample indices (int64), advancing the position."""
        parts: list[np.ndarray] = []
        need = self.global_batch_size
        pos = self.consumed
        while need > 0:
            epoch, offset = divmod(pos, self.num_samples)
            take = min(need, self.num_samples - offset)
            parts.append(self._permutation(epoch)[offset : offset + take])
            pos += take
            need -= take
        self.consumed = pos
        return np.concatenate(parts)

    def state_dict(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples, "seed": self.seed, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A position is only meaningful in the same index stream: same dataset size, same shuffling seed.
        num_samples, seed = int(state["num_samples"]), int(state["seed"])
        if num_samples != self.num_samples:
            raise ValueError(
                f"sampler state is for a dataset of {num_samples} samples, but this dataset has "
                f"{self.num_samples}; resuming would silently change which samples are seen"
            )
        if seed != self.seed:
            raise ValueError(
                f"sampler state was saved with seed={seed}, but this sampler has seed={self.seed}"
            )
        consumed = int(state["consumed"])
        if consumed < 0:
            raise ValueError(f"sampler state has consumed={consumed}; expected a non-negative count")
        self.consumed = consumed


def shard_for_rank(global_batch: np.ndarray, dp_rank: int, dp_size: int) -> np.ndarray:
    """Rank ``dp_rank``'s contiguous, equal share of ``global_batch``."""
    n = len(global_batch)
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} is not in [0, dp_size={dp_size})")
    if n % dp_size != 0:
        raise ValueError(f"global batch of {n} samples does not split evenly over dp_size={dp_size} ranks")
    per_rank = n // dp_size
    return global_batch[dp_rank * per_rank : (dp_rank + 1) * per_rank]


def split_micro_batches(indices: np.ndarray, micro_batch_size: int) -> list[np.ndarray]:
    """Consecutive micro-batches of exactly ``micro_batch_size`` (for gradient accumulation)."""
    n = len(indices)
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be at least 1")
    if n % micro_batch_size != 0:
        raise ValueError(f"{n} samples per rank do not split into micro-batches of {micro_batch_size}")
    return [indices[i : i + micro_batch_size] for i in range(0, n, micro_batch_size)]
