"""Checkpoint save and load through an object store (``checkpoint.path=s3://…``) against the same bytes
``put`` and ``get`` through the same client, in the same run: what hpctrain's format, checksums and
commit cost on top of the store's own speed.

    python bench/object_store.py [--mib 512] [--rounds 3]

The store is moto's S3 server on loopback (tests/support/s3.py), in its own process: its speed is the
machine's (Python in the server), not a real store's, which is why only the ratios travel. One process saves
a state of ``--mib`` MiB of float32 tensors (a model's parameters and two optimizer moments, 1/3 each)
through the checkpoint manager with the object tier, then resumes it into a fresh state; the reference puts
and gets one object of the shard's size with ``fs.pipe_file``/``fs.cat_file``. Prints GiB/s for each and
hpctrain/reference ratios (> 1: slower than the bare client).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.objects import ObjectTier
from hpctrain.checkpoint.state import TrainState
from hpctrain.rundir.objects import Store
from tests.support import s3

GIB = 1024**3


class Tensors:
    """A Stateful of named tensors (what DCP saves for a model and its optimizer)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            self.tensors[key].copy_(value)


def state(mib: int, seed: int) -> dict[str, object]:
    torch.manual_seed(seed)
    per = mib * 2**20 // 4 // 24  # 24 tensors of float32
    return {
        "model": Tensors({f"w{i}": torch.randn(per) for i in range(8)}),
        "optim": Tensors({f"m{i}": torch.randn(per) for i in range(16)}),
        "train": TrainState(step=0),
    }


def main() -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process by design
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = s3.start()
    server.bucket("bench")
    saves, loads, puts, gets = [], [], [], []
    try:
        with tempfile.TemporaryDirectory() as records:
            for r in range(args.rounds):
                store = Store(f"s3://bench/round{r}", server.options())
                root = store.root()
                tier = ObjectTier(root, store)
                saved = state(args.mib, seed=r)
                manager = CheckpointManager(Path(records) / f"r{r}", keep_last=1, rank=0, tier=tier)
                started = time.perf_counter()
                manager.save(1, saved)
                saves.append(time.perf_counter() - started)
                manager.close()
                shard = root / "step_00000001" / "__0_0.distcp"
                nbytes = shard.stat().st_size

                fresh = state(args.mib, seed=1000 + r)
                loader = CheckpointManager(Path(records) / f"r{r}", keep_last=1, rank=0, tier=tier)
                started = time.perf_counter()
                assert loader.resume(fresh, "auto") is not None
                loads.append(time.perf_counter() - started)
                loader.close()
                assert all(
                    torch.equal(fresh["model"].tensors[k], saved["model"].tensors[k])
                    for k in saved["model"].tensors
                )

                data = bytes(nbytes)
                started = time.perf_counter()
                root.fs.pipe_file(f"{root.key}/reference", data)
                puts.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert len(root.fs.cat_file(f"{root.key}/reference")) == nbytes
                gets.append(time.perf_counter() - started)
    finally:
        server.stop()
    size = nbytes / GIB
    rate = {
        name: size / statistics.median(times)
        for name, times in (("save", saves), ("load", loads), ("put", puts), ("get", gets))
    }
    print(f"state {nbytes / 2**20:.0f} MiB, {args.rounds} rounds, medians (moto's S3 server on loopback)")
    for what, ref in (("save", "put"), ("load", "get")):
        print(
            f"  hpctrain {what}  {rate[what]:.3f} GiB/s   {ref} of the same bytes {rate[ref]:.3f} GiB/s   "
            f"{what}/{ref} time {rate[ref] / rate[what]:.2f} x"
        )


if __name__ == "__main__":
    main()
