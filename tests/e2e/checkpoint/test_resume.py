"""Exact resume (DDP on gloo, through the CLI), and what happens to checkpoints incomplete or damaged."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.rundir import checkpoints as layout
from tests.support import CLI, FAST, hpctrain, metrics, model_and_optimizer

# Dropout on: resume must also restore every rank's RNG streams to be exact.
EXACT = [
    *FAST,
    "model.dropout=0.1",
    "trainer.max_steps=20",
    "trainer.log_every=1",
    "trainer.ckpt_every=5",
    "trainer.eval_every=0",
]


def test_resume_after_a_crash_is_bitwise_exact(tmp_path: Path):
    # 4 ranks: beyond two, the all-reduce's summation order depends on DDP's bucket layout, which a resumed
    # run must reproduce (hpctrain.parallel.apply.prime_ddp_buckets); 2 ranks would not see it fail.
    nproc = 4
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    exact = [*EXACT, f"cluster.nproc={nproc}", "trainer.global_batch_size=32", "trainer.micro_batch_size=4"]
    a = hpctrain(*exact, f"hydra.run.dir={run_a}")
    assert a.returncode == 0, a.stderr

    crashed = hpctrain(*exact, "faults.fail_at=0:11", f"hydra.run.dir={run_b}")
    assert crashed.returncode == 1
    assert "rank 0" in crashed.stderr and "injected failure at step 11" in crashed.stderr
    assert [p.name for p in layout.committed(run_b / "checkpoints")] == ["step_00000010", "step_00000005"]

    resumed = hpctrain(*exact, "trainer.resume=auto", f"hydra.run.dir={run_b}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resumed from {run_b}/checkpoints/step_00000010 (step 10)" in resumed.stdout
    # The random init the checkpoint overwrites was skipped (zeros instead), and the run is still exact.
    said = (
        f"without its random init: the checkpoint {run_b}/checkpoints/step_00000010 overwrites every weight"
    )
    assert said in resumed.stdout and "without its random init" not in a.stdout

    final_a = model_and_optimizer(run_a / "checkpoints" / "step_00000020")
    final_b = model_and_optimizer(run_b / "checkpoints" / "step_00000020")
    assert final_a.keys() == final_b.keys()
    unequal = [k for k in final_a if not torch.equal(final_a[k], final_b[k])]
    assert not unequal, f"{len(unequal)} tensors differ, e.g. {unequal[:3]}"

    losses_a = {r["step"]: r["loss"] for r in metrics(run_a)}
    records_b = metrics(run_b)
    assert [r["step"] for r in records_b] == list(range(1, 21)), "every step logged exactly once"
    assert {r["step"]: r["loss"] for r in records_b if r["step"] > 10} == {
        s: losses_a[s] for s in range(11, 21)
    }


def test_asynchronous_checkpoints_resume_bitwise(tmp_path: Path):
    # Weights and AdamW moments staged beside the next step (its optimizer.step() waits for the copy), shards
    # written by a background thread and committed as soon as they are written: resuming the newest is exact.
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    exact = [*EXACT, "cluster.nproc=2"]
    a = hpctrain(*exact, f"hydra.run.dir={run_a}")
    assert a.returncode == 0, a.stderr
    asynchronous = [*exact, "trainer.async_checkpoint=true"]
    crashed = hpctrain(*asynchronous, "faults.fail_at=1:14", f"hydra.run.dir={run_b}")
    assert crashed.returncode == 1
    newest = layout.committed(run_b / "checkpoints")[0]  # step 10, unless its write outlasted 4 steps
    assert layout.step_of(newest) in (5, 10)
    resumed = hpctrain(*asynchronous, f"hydra.run.dir={run_b}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resumed from {newest} (step {layout.step_of(newest)})" in resumed.stdout
    final_a = model_and_optimizer(run_a / "checkpoints" / "step_00000020")
    final_b = model_and_optimizer(run_b / "checkpoints" / "step_00000020")
    unequal = [k for k in final_a if not torch.equal(final_a[k], final_b[k])]
    assert final_a.keys() == final_b.keys() and not unequal, f"{len(unequal)} differ, e.g. {unequal[:3]}"


def test_uncommitted_and_truncated_checkpoints_are_never_loaded(tmp_path: Path):
    run = tmp_path / "run"
    args = [
        *FAST,
        "trainer.max_steps=20",
        "trainer.ckpt_every=5",
        "trainer.keep_last=4",
        "cluster.nproc=2",
        f"hydra.run.dir={run}",
    ]
    assert hpctrain(*args).returncode == 0
    root = run / "checkpoints"
    assert [p.name for p in layout.committed(root)] == [f"step_{s:08d}" for s in (20, 15, 10, 5)]

    # A crash mid-save leaves the newest one under its temporary name: it was never committed.
    (root / "step_00000020").rename(root / ".tmp-step_00000020")
    # The next newest lost the end of a shard (a full disk, a copy cut short).
    shard = max((root / "step_00000015").glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)

    result = hpctrain(*args[:-1], "trainer.max_steps=25", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr
    log = (run / "logs" / "rank0.log").read_text()
    assert f"Skipping checkpoint {root}/step_00000015: {shard.name} has" in log
    assert f"Resumed from {root}/step_00000010 (step 10)" in log
    assert "step_00000020" not in log.split("Resumed from")[0], "the uncommitted checkpoint was considered"
    assert not (root / ".tmp-step_00000020").exists()
    assert metrics(run)[-1]["step"] == 25


def test_explicit_resume_path_that_is_damaged_fails_without_loading(cli: CLI, tmp_path: Path):
    run = tmp_path / "run"
    args = [*FAST, "trainer.max_steps=5", "cluster.nproc=1", "parallel=none", f"hydra.run.dir={run}"]
    assert hpctrain(*args).returncode == 0
    checkpoint = run / "checkpoints" / "step_00000005"
    (checkpoint / ".metadata").write_bytes(b"")
    result = cli(*args, f"trainer.resume={checkpoint}")  # refused before anything starts: in this process
    assert result.returncode == 2
    assert result.stderr.strip().startswith(
        f"hpctrain: trainer.resume={checkpoint}: not a loadable checkpoint"
    )
