"""Random samples shaped as a built-in model takes them: what ``data=synthetic`` feeds (made by a spec's
``synthetic_dataset``). Learnable, seeded, and sample i is a pure function of the arguments and i, so any
rank builds any sample and resumes are exact."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Streams of np.random.default_rng((seed, STREAM, ...)): distinct so that tables and samples never share
# random numbers.
_TABLE_STREAM = 0
_SAMPLE_STREAM = 1


def _as_indices(indices: Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"sample indices span [{idx.min()}, {idx.max()}] but the dataset has {n} samples")
    return idx


class SyntheticTokens:
    """Token sequences from a fixed random sparse Markov chain: learnable, unlike uniform noise.

    Each token has ``branching`` possible successors with Dirichlet(1) probabilities, so the best achievable
    loss (the chain's entropy rate, at most ln(branching)) sits far below ln(vocab_size) and a tiny GPT's
    loss visibly drops. Sample i is drawn from ``default_rng((seed, 1, i))``; nothing is stored per sample.
    """

    def __init__(
        self, num_samples: int, seq_len: int, vocab_size: int, seed: int, branching: int = 4
    ) -> None:
        if num_samples < 1 or seq_len < 1 or vocab_size < 2:
            raise ValueError(
                f"need num_samples ≥ 1, seq_len ≥ 1, vocab_size ≥ 2; "
                f"got {num_samples}, {seq_len}, {vocab_size}"
            )
        self.num_samples, self.seq_len, self.vocab_size, self.seed = num_samples, seq_len, vocab_size, seed
        rng = np.random.default_rng((seed, _TABLE_STREAM))
        self.successors = rng.integers(0, vocab_size, size=(vocab_size, branching))
        probs = rng.dirichlet(np.ones(branching), size=vocab_size)
        self.cdf = np.cumsum(probs, axis=1)
        self.cdf[:, -1] = 1.0  # guard against rounding: a uniform draw < 1 always finds a successor

    def __len__(self) -> int:
        return self.num_samples

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = _as_indices(indices, self.num_samples)
        B, T = idx.size, self.seq_len
        seqs = np.empty((B, T + 1), dtype=np.int64)
        u = np.empty((B, T), dtype=np.float64)
        for row, i in enumerate(idx):
            rng = np.random.default_rng((self.seed, _SAMPLE_STREAM, int(i)))
            seqs[row, 0] = rng.integers(self.vocab_size)
            u[row] = rng.random(T)
        # Walk the chain for all rows at once: one vectorised step per position.
        for t in range(T):
            cur = seqs[:, t]
            choice = (u[:, t, None] >= self.cdf[cur]).sum(axis=1)
            seqs[:, t + 1] = self.successors[cur, choice]
        seqs_t = torch.from_numpy(seqs)
        return seqs_t[:, :-1].contiguous(), seqs_t[:, 1:].contiguous()


class SyntheticImages:
    """Class-conditional images: a fixed random template per class plus unit Gaussian noise.

    Sample i (label and noise) is drawn from ``default_rng((seed, 1, i))``.
    """

    def __init__(
        self, num_samples: int, C: int, H: int, W: int, num_classes: int, seed: int, noise: float = 1.0
    ) -> None:
        if num_samples < 1 or num_classes < 1:
            raise ValueError(f"need num_samples ≥ 1 and num_classes ≥ 1; got {num_samples}, {num_classes}")
        self.num_samples, self.shape, self.num_classes, self.seed = num_samples, (C, H, W), num_classes, seed
        self.noise = noise
        rng = np.random.default_rng((seed, _TABLE_STREAM))
        self.templates = rng.standard_normal((num_classes, C, H, W), dtype=np.float32)

    def __len__(self) -> int:
        return self.num_samples

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = _as_indices(indices, self.num_samples)
        images = np.empty((idx.size, *self.shape), dtype=np.float32)
        labels = np.empty(idx.size, dtype=np.int64)
        for row, i in enumerate(idx):
            rng = np.random.default_rng((self.seed, _SAMPLE_STREAM, int(i)))
            labels[row] = rng.integers(self.num_classes)
            images[row] = rng.standard_normal(self.shape, dtype=np.float32)
        images = self.templates[labels] + self.noise * images
        return torch.from_numpy(images), torch.from_numpy(labels)
