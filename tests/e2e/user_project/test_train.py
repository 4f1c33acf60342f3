"""Bring your own model, data and loss: examples/user_project, copied to a folder outside the package and
run from there as a user would (``python -m hpctrain --config-dir conf ...``): it trains, resumes exactly with
DataLoader workers, and a transformers GPT-2 under DDP and FSDP matches one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.errors import CheckpointMismatch
from hpctrain.train.overrides import check_changes, config_changes
from tests.support import model_and_optimizer
from tests.support.user_project import SHORT, losses, metrics, user


@pytest.mark.parametrize(
    "args",
    [
        ["model=gpt2_tiny", "data=bytes", "data.max_bytes=100000"],
        ["model=gpt2_tiny", "data=bytes", "data.max_bytes=100000", "data.shift=false", "loss=model"],
    ],
    ids=["gpt2-bytes", "gpt2-own-loss"],  # the CNN trains in the resume test below
)
def test_users_model_and_data_train_from_their_folder(project: Path, tmp_path: Path, args: list[str]):
    run = tmp_path / "run"
    result = user(project, *args, *SHORT, "trainer.max_steps=30", "cluster.nproc=2", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr
    seen = losses(run)
    first, last = sum(seen[s] for s in (1, 2, 3)) / 3, sum(seen[s] for s in (28, 29, 30)) / 3
    assert last < 0.8 * first, (first, last)
    assert "val_loss" in metrics(run)[-1]


def test_resume_of_a_users_model_and_data_with_workers_is_exact(project: Path, tmp_path: Path):
    args = [
        "model=cnn",
        "data=digits8",
        "data.num_workers=2",
        *SHORT,
        "trainer.max_steps=20",
        "trainer.ckpt_every=10",
        "cluster.nproc=2",
        "optim.lr=1e-2",
        "optim.warmup_steps=2",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    assert user(project, *args, f"hydra.run.dir={a}").returncode == 0
    # The second half again from the first's step-10 checkpoint, with new workers (a crash before the resume,
    # tests/e2e/checkpoint/test_resume.py's case, changes nothing of what is loaded).
    resumed = user(project, *args, f"trainer.resume={a}/checkpoints/step_00000010", f"hydra.run.dir={b}")
    assert resumed.returncode == 0, resumed.stderr
    assert "(step 10)" in resumed.stdout
    expected = losses(a)
    assert expected[20] < 0.8 * expected[1], expected  # it learns
    assert {s: v for s, v in losses(b).items() if s > 10} == {s: expected[s] for s in range(11, 21)}
    # Another split of the user's data cannot continue this run (checked as the worker does, in one line);
    # other workers can.
    checkpoint = b / "checkpoints" / "step_00000020"
    saved = (checkpoint / "config.yaml").read_text()
    edited = tmp_path / "edited" / "config.yaml"
    edited.parent.mkdir()
    edited.write_text(
        saved.replace("val_fraction: 0.1", "val_fraction: 0.2").replace("num_workers: 2", "num_workers: 0")
    )
    changes = config_changes(checkpoint, edited)
    assert set(changes) == {"data.val_fraction"}
    with pytest.raises(CheckpointMismatch, match=r"^data.val_fraction=0.2: checkpoint .* was trained with"):
        check_changes(checkpoint, changes)
    final_a = model_and_optimizer(a / "checkpoints" / "step_00000020")
    final_b = model_and_optimizer(b / "checkpoints" / "step_00000020")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)


def test_transformers_gpt2_under_ddp_and_fsdp_matches_one_process(project: Path, tmp_path: Path):
    """5 steps of the same global batch of 16: 1 process vs DDP and FSDP + activation checkpointing on 2."""
    common = [
        "model=gpt2_tiny",
        "data=bytes",
        "data.max_bytes=100000",
        *SHORT,
        "trainer.max_steps=5",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=8",
    ]
    layouts = {
        "one": ["parallel=none", "cluster.nproc=1", "trainer.micro_batch_size=16"],
        "ddp": ["parallel=ddp", "cluster.nproc=2"],
        "fsdp": ["parallel=fsdp", "parallel.activation_checkpointing=full", "cluster.nproc=2"],
    }
    runs = {}
    for name, extra in layouts.items():
        runs[name] = tmp_path / name
        result = user(project, *common, *extra, f"hydra.run.dir={runs[name]}")
        assert result.returncode == 0, (name, result.stderr)
    reference = losses(runs["one"])
    weights = model_and_optimizer(runs["one"] / "checkpoints" / "step_00000005")
    for name in ("ddp", "fsdp"):
        got = losses(runs[name])
        assert max(abs(got[s] - reference[s]) for s in range(1, 6)) < 1e-5, (name, got, reference)
        final = model_and_optimizer(runs[name] / "checkpoints" / "step_00000005")
        worst = max(float((final[k] - weights[k]).abs().max()) for k in weights if k.startswith("model."))
        assert worst < 1e-5, (name, worst)
