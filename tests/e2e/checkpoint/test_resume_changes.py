"""Issue 13's data-loss promises: a resume that cannot honour the config refuses (one line, nothing touched);
checkpoints are pruned only by the run history that wrote them; overrides on resume are honoured. The tests
that resume a 10-step run each resume their own copy of one such run."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from hpctrain.checkpoint.tiers import read_checkpoint
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
        "trainer.micro_batch_size=8",  # the kept global batch of 16 splits over 2 ranks: the shape refuses
        "parallel=ddp",
        f"hydra.run.dir={run}",
    )
    assert changed.returncode != 0
    lines = [line for line in changed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, changed.stderr
    line = lines[0]
    assert "CheckpointMismatch" in line and "in the checkpoint" in line and "in the model" in line, line
    assert "64" in line and "128" in line, line
    assert "run=NAME" in line and "hydra.run.dir" in line, line
    assert "alike" in line, line
    assert tree_hashes(run / "checkpoints") == before


def test_fresh_run_over_old_checkpoints_is_refused_and_changes_nothing(first_run: Path, tmp_path: Path):
    """trainer.resume=never over a run would write over its checkpoints and metrics: refused in one line,
    before anything is written (issue 29)."""
    run = copy_of(first_run, tmp_path)  # its first run kept 2 checkpoints (keep_last=2)
    before = {k: v for k, v in tree_hashes(run).items() if k != ".lock"}  # the lock records who probed it

    fresh = hpctrain(
        *BASE, "trainer.keep_last=1", "trainer.max_steps=15", "trainer.resume=never", f"hydra.run.dir={run}"
    )
    assert fresh.returncode == 2, fresh.stderr
    lines = [line for line in fresh.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "trainer.resume=never" in lines[0] and "step 10" in lines[0], fresh.stderr
    assert {k: v for k, v in tree_hashes(run).items() if k != ".lock"} == before


def test_a_change_resume_cannot_honour_is_refused_in_one_line(first_run: Path, tmp_path: Path):
    run = copy_of(first_run, tmp_path)
    before = tree_hashes(run / "checkpoints")

    seed = hpctrain(*BASE, "trainer.max_steps=12", "trainer.seed=7", f"hydra.run.dir={run}")
    assert seed.returncode != 0
    lines = [line for line in seed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hpctrain: trainer.seed=7: checkpoint"), seed.stderr
    assert "run=NAME" in lines[0]  # how to start fresh instead
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
