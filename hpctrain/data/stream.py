"""This rank's batches, step by step, in the order the global batch sampler defines.

``next_step()`` returns the rank's passes of the next optimizer step and advances the sampler by exactly one
global batch, so a checkpoint taken after step N holds the sampler's state after N steps however far worker
processes have read ahead. With ``num_workers=0`` batches are built on the training thread; with workers a
``torch.utils.data.DataLoader`` builds them ahead, each worker calling the dataset's ``get_batch`` on index
lists computed from a private copy of the sampler taken when the loader starts (lazily, at the first step,
so a sampler state loaded from a checkpoint after construction is honoured). The DataLoader returns batches
in order, so the two paths give the same batches bit for bit.

Workers start with ``forkserver``: the training process runs torch.distributed's threads (gloo, NCCL
watchdogs), and a fork taken while one of them holds a lock can deadlock the child (torch's
multiprocessing notes); a spawned/forkserver worker starts clean and imports the dataset's module by name.
The dataset travels pickled: a TokenWindows over a token file pickles as the file's name (1.3 KB), not as a
copy of the tokens. The forkserver preloads torch, so a worker starts in ~0.15 s, not ~2 s (spawn).
"""

from __future__ import annotations

import copy
import multiprocessing
import signal
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from hpctrain.data.sampler import GlobalBatchSampler, shard_for_rank, split_micro_batches

_PRELOAD = ("torch", "hpctrain.data.datasets", "hpctrain.data.user", "hpctrain.data.stream")


class _Batches:
    """A map-style view whose item ``indices`` is the batch ``dataset.get_batch(indices)``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, indices: np.ndarray) -> Any:
        return self.dataset.get_batch(indices)

    def __len__(self) -> int:
        return len(self.dataset)


# What stops a run (Ctrl-C, SIGTERM from the launcher or scancel, Slurm's warning): the trainer's to answer,
# with a checkpoint. A DataLoader worker is in the trainer's process group and Slurm's job step, so it gets
# them too: it ignores them, or it would die and fail the step the trainer is finishing before its save.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


def _worker_init(worker_id: int) -> None:
    import torch

    for sig in STOP_SIGNALS:  # ignored, then unblocked: one that came while the worker started is dropped
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    torch.set_num_threads(1)  # a worker builds one batch at a time; more threads only oversubscribe the cores


class BatchStream:
    def __init__(
        self,
        dataset: Any,
        sampler: GlobalBatchSampler,
        dp_rank: int,
        dp_size: int,
        per_pass: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
    ) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.dp_rank, self.dp_size, self.per_pass = dp_rank, dp_size, per_pass
        self.num_workers, self.pin_memory, self.seed = num_workers, pin_memory, seed
        self.data_wait_s = 0.0  # how long the last next_step waited for its batches
        self._loader: Any = None
        self._batches: Iterator[Any] | None = None

    def _rank_passes(self, sampler: GlobalBatchSampler) -> list[np.ndarray]:
        indices = shard_for_rank(sampler.next_global_batch(), self.dp_rank, self.dp_size)
        return split_micro_batches(indices, self.per_pass)

    def _index_lists(self, sampler: GlobalBatchSampler) -> Iterator[np.ndarray]:
        while True:  # the loader stops when the stream is closed
            yield from self._rank_passes(sampler)

    def _start(self) -> None:
        import torch
        from torch.utils.data import DataLoader

        ahead = copy.deepcopy(self.sampler)  # the loader reads ahead on its own copy
        context = multiprocessing.get_context("forkserver")
        # The server imports torch once and forks each worker from itself (single-threaded, so safe): a
        # worker then starts in ~0.1 s instead of importing torch anew (~2 s each on a busy node). Honoured
        # only while the server has not started yet; a module that fails to import there is skipped.
        context.set_forkserver_preload(list(_PRELOAD))
        self._loader = DataLoader(
            _Batches(self.dataset),
            batch_size=None,
            sampler=self._index_lists(ahead),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=False,
            worker_init_fn=_worker_init,
            # Without its own generator the loader draws the workers' base seed from the global torch RNG,
            # shifting the training process's random stream (dropout) away from the num_workers=0 run.
            generator=torch.Generator().manual_seed(self.seed),
            multiprocessing_context=context,
        )
        # The workers (and the forkserver they fork from) start with the stop signals blocked and inherit
        # that, so none lands between a worker starting and _worker_init ignoring it; the trainer's own are
        # delivered to it when the mask is restored. The resource tracker first: starting it unblocks them.
        resource_tracker.ensure_running()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self._batches = iter(self._loader)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def next_step(self) -> list[Any]:
        """This rank's passes of the next step (a batch each), advancing the sampler by one global batch."""
        start = time.perf_counter()
        if self.num_workers > 0 and self._batches is None:
            self._start()  # before the sampler advances: the loader's copy starts at this step
        chunks = self._rank_passes(self.sampler)
        if self._batches is None:
            out = [self.dataset.get_batch(ix) for ix in chunks]
        else:
            out = [next(self._batches) for _ in chunks]
        self.data_wait_s = time.perf_counter() - start
        return out

    def close(self) -> None:
        """Stop the workers now (not whenever the garbage collector drops the iterator); idempotent."""
        batches, self._batches, self._loader = self._batches, None, None
        if batches is not None:  # a DataLoader's iterator: torch is imported
            from hpctrain import torchapi

            torchapi.shutdown_loader_workers(batches)
