"""Issue 13's data-loss promises: a resume that cannot honour the config refuses (one line, nothing touched);
checkpoints are pruned only by the run history that wrote them; overrides on resume are honoured. The tests
that resume a 10-step run each resume their own copy of one such run."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from hpctrain.checkpoint.manager import read_checkpoint
from hpctrain.rundir import checkpoints as layout
from hpctrain.train.optim import lr_factor
from tests.support import FAST, hpctrain, metrics

BASE = [
    *FAST,
    "cluster.nproc=1",
    "parallel=none",
    "trainer.max_steps=10",
    "trainer.ckpt_every=5",
    "trainer.log_every=1",
    "trainer.eval_every=0",
]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of BASE (10 steps, checkpoints at 5 and 10: keep_last is 2), the first run of each test below;
    each test resumes a copy of it."""
    run = tmp_path_factory.mktemp("first") / "run"
    first = hpctrain(*BASE, f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr
    assert [c.name for c in layout.committed(run / "checkpoints")] == ["step_00000010", "step_00000005"]
    return run


def copy_of(first_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(first_run, run)
    return run


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_changed_model_shape_refuses_in_one_line_and_touches_nothing(first_run: Path, tmp_path: Path):
    run = copy_of(first_run, tmp_path)
    before = tree_hashes(run / "checkpoints")
    assert before

    # Two ranks refuse alike: still one line.
    single = ("cluster.nproc=", "parallel=")
    changed = hpctrain(
        *[a for a in BASE if not a.startswith(single)],
        "trainer.keep_last=1",
        "trainer.max_steps=20",
        "model.d_model=128",
        "cluster.nproc=2",
        "parallel=ddp",
        f"hydra.run.dir={run}",
    )
    assert changed.returncode != 0
    lines = [line for line in changed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, changed.stderr
    line = lines[0]
    assert "CheckpointMismatch" in line and "in the checkpoint" in line and "in the model" in line, line
    assert "64" in line and "128" in line, line
    assert "trainer.resume=never" in line and "hydra.run.dir" in line, line
    assert "alike" in line, line
    assert tree_hashes(run / "checkpoints") == before


def test_fresh_run_over_old_checkpoints_neither_prunes_nor_overwrites_them(first_run: Path, tmp_path: Path):
    run = copy_of(first_run, tmp_path)  # its first run kept 2 checkpoints (keep_last=2)
    root = run / "checkpoints"
    before = {c.name: tree_hashes(c) for c in layout.committed(root)}
    assert sorted(before) == ["step_00000005", "step_00000010"]

    fresh = hpctrain(
        *BASE, "trainer.keep_last=1", "trainer.max_steps=15", "trainer.resume=never", f"hydra.run.dir={run}"
    )
    assert fresh.returncode == 0, fresh.stderr
    assert "Resumed from" not in fresh.stdout
    steps = [r["step"] for r in metrics(run)]
    assert steps[-15:] == list(range(1, 16)), "the fresh run trained from step 0"
    # The old lineage's checkpoints are all still there, byte for byte (the same-named ones moved aside).
    now = [tree_hashes(p) for p in root.iterdir() if p.is_dir()]
    for name, hashes in before.items():
        assert hashes in now, f"{name} of the first run was deleted or changed"
    # The fresh run pruned its own: only its newest survives.
    new_lineage = layout.lineage_of(root / "step_00000015")
    mine = [c.name for c in layout.committed(root) if layout.lineage_of(c) == new_lineage]
    assert mine == ["step_00000015"]


def test_a_change_resume_cannot_honour_is_refused_in_one_line(first_run: Path, tmp_path: Path):
    run = copy_of(first_run, tmp_path)
    before = tree_hashes(run / "checkpoints")

    seed = hpctrain(*BASE, "trainer.max_steps=12", "trainer.seed=7", f"hydra.run.dir={run}")
    assert seed.returncode != 0
    lines = [line for line in seed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "CheckpointMismatch: trainer.seed=7" in lines[0], seed.stderr
    assert "trainer.resume=never" in lines[0]
    assert tree_hashes(run / "checkpoints") == before


def test_changed_lr_on_resume_is_honoured(first_run: Path, tmp_path: Path):
    run = copy_of(first_run, tmp_path)
    resumed = hpctrain(*BASE, "trainer.max_steps=12", "optim.lr=0.01", f"hydra.run.dir={run}")
    assert resumed.returncode == 0, resumed.stderr
    assert "Resume honours the changed config: optim.lr 0.001 -> 0.01" in resumed.stdout
    lr = {r["step"]: r["lr"] for r in metrics(run)}
    # Step 11 runs at schedule position 10 of 12 (warmup 10): the new peak times the same factor.
    assert lr[11] == pytest.approx(0.01 * lr_factor(10, 10, 12, 0.1))
    assert lr[12] == pytest.approx(0.01 * lr_factor(11, 10, 12, 0.1))


def test_resume_on_fewer_ranks_keeps_the_global_batch(tmp_path: Path):
    run = tmp_path / "run"
    args = [*FAST, "trainer.ckpt_every=5", "trainer.eval_every=0", "trainer.micro_batch_size=4"]
    first = hpctrain(*args, "cluster.nproc=2", "trainer.max_steps=5", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr
    resumed = hpctrain(
        *args, "cluster.nproc=1", "parallel=none", "trainer.max_steps=7", f"hydra.run.dir={run}"
    )
    assert resumed.returncode == 0, resumed.stderr
    sampler = read_checkpoint(run / "checkpoints" / "step_00000007")["sampler"]
    assert sampler["consumed"] == 7 * 2 * 4, "each step after the resume still took 2 x 4 samples"
