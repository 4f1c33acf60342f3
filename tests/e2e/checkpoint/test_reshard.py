"""Resume on another world size: a checkpoint written by 4 ranks resumes on 2, and one written by 2 on 1.

Model and optimizer reshard through DCP; the data position is kept in global samples, so the samples seen
over the interrupted run are exactly those of an uninterrupted one (none skipped, none repeated); per-rank
RNG streams are matched by rank (a rank the checkpoint has none for starts a fresh, deterministic one: in one
process, tests/unit/checkpoint/test_manager.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpctrain.checkpoint.tiers import read_checkpoint
from hpctrain.data import GlobalBatchSampler, shard_for_rank
from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, hpctrain, metrics

GLOBAL_BATCH = 16  # divisible by 4, 2 and 1 data-parallel ranks: micro-batches of 4, 1 to 4 per rank
MAX_STEPS = 12
BASE = [
    *FAST,
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.global_batch_size={GLOBAL_BATCH}",
    "trainer.micro_batch_size=4",
    "trainer.log_every=1",
    "trainer.ckpt_every=4",
    "trainer.eval_every=0",
    "trainer.keep_last=5",
]
ONE_PROCESS = ["cluster.nproc=1", "parallel=none"]


def rng_ranks(checkpoint: Path) -> list[int]:
    return sorted(
        int(key[len("rng_rank") :]) for key in read_checkpoint(checkpoint) if key.startswith("rng_")
    )


def samples_seen(consumed_from: int, steps: int, num_samples: int, seed: int) -> np.ndarray:
    """The global sample indices of ``steps`` steps that start at stream position ``consumed_from``."""
    sampler = GlobalBatchSampler(num_samples, GLOBAL_BATCH, seed)
    sampler.load_state_dict({"num_samples": num_samples, "seed": seed, "consumed": consumed_from})
    return np.concatenate([sampler.next_global_batch() for _ in range(steps)])


def test_checkpoint_of_4_ranks_resumes_on_2_then_on_1(tmp_path: Path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    root = run / "checkpoints"
    reference = hpctrain(*BASE, *ONE_PROCESS, f"hydra.run.dir={ref}")
    assert reference.returncode == 0, reference.stderr

    # Segment 1: 4 ranks, steps 1-4, checkpoint at 4, rank 0 fails before step 5.
    first = hpctrain(*BASE, "cluster.nproc=4", "faults.fail_at=0:5", f"hydra.run.dir={run}")
    assert first.returncode == 1 and "injected failure at step 5" in first.stderr
    # Segment 2: 2 ranks resume from step 4, checkpoint at 8, rank 0 fails before step 9.
    second = hpctrain(*BASE, "cluster.nproc=2", "faults.fail_at=0:9", f"hydra.run.dir={run}")
    assert second.returncode == 1 and "injected failure at step 9" in second.stderr
    log = (run / "logs" / "rank0.log").read_text()
    assert f"Resumed from {root}/step_00000004 (step 4)" in log
    assert "step_00000004 was saved by 4 ranks, this run has 2: RNG states of ranks 2, 3 are not used" in log
    # Segment 3: 1 process resumes from step 8 and finishes.
    third = hpctrain(*BASE, *ONE_PROCESS, f"hydra.run.dir={run}")
    assert third.returncode == 0, third.stderr
    log = (run / "logs" / "rank0.log").read_text()
    assert f"Resumed from {root}/step_00000008 (step 8)" in log

    # Each checkpoint holds the RNG streams of the ranks that wrote it, and the sampler's position in
    # global samples is exactly steps × global batch: no sample skipped or repeated at a resume.
    checkpoints = {s: root / layout.checkpoint_name(s) for s in (4, 8, 12)}
    assert [p.name for p in layout.committed(root)] == [checkpoints[s].name for s in (12, 8, 4)]
    assert [rng_ranks(checkpoints[s]) for s in (4, 8, 12)] == [[0, 1, 2, 3], [0, 1], [0]]
    samplers = {s: read_checkpoint(c)["sampler"] for s, c in checkpoints.items()}
    assert {s: state["consumed"] for s, state in samplers.items()} == {
        s: s * GLOBAL_BATCH for s in (4, 8, 12)
    }
    assert read_checkpoint(ref / "checkpoints" / "step_00000012")["sampler"] == samplers[12]

    # Every step logged once; each segment continues from its checkpoint: the losses follow the
    # uninterrupted run's (same samples, same weights; only the order of float sums differs with the
    # number of ranks) rather than starting over from the initial loss.
    records = metrics(run)
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1)), "every step logged exactly once"
    ref_losses = {r["step"]: r["loss"] for r in metrics(ref)}
    losses = {r["step"]: r["loss"] for r in records}
    assert ref_losses[MAX_STEPS] < ref_losses[1] - 0.1, "the reference run learns"
    for step in range(1, MAX_STEPS + 1):
        assert losses[step] == pytest.approx(ref_losses[step], rel=0, abs=1e-4), step

    # The samples seen: segment k trains from the position of the checkpoint it resumed from, for the steps
    # it logged. Each rank's shard of a global batch is a contiguous slice, so the ranks of every segment
    # together see exactly the global batch; the multiset over all segments is the uninterrupted run's.
    num_samples, seed = int(samplers[4]["num_samples"]), int(samplers[4]["seed"])
    segments = [(0, 4, 4), (samplers[4]["consumed"], 4, 2), (samplers[8]["consumed"], 4, 1)]
    seen: Counter[int] = Counter()
    for consumed_from, steps, ranks in segments:
        batch = samples_seen(consumed_from, steps, num_samples, seed).reshape(steps, GLOBAL_BATCH)
        for global_batch in batch:
            shards = [shard_for_rank(global_batch, r, ranks) for r in range(ranks)]
            assert Counter(np.concatenate(shards).tolist()) == Counter(global_batch.tolist())
            for shard in shards:
                seen.update(shard.tolist())
    uninterrupted = samples_seen(0, MAX_STEPS, num_samples, seed)
    assert seen == Counter(uninterrupted.tolist())
    assert sum(seen.values()) == MAX_STEPS * GLOBAL_BATCH
