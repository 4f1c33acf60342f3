"""Issue 5: every parallel layout trains like one process, and a checkpoint moves between layouts.

The parity table (``python -m hpctrain.verify.parity``) is the acceptance test itself: each layout runs the
real trainer for 10 steps and its losses must match the single-process run's (fp32: within 1e-5, relative).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.verify.layouts import LAYOUTS, MODELS
from hpctrain.verify.parity import CASES, EXTRA_CASES
from tests.support import REPO, hpctrain, metrics

# The tables at 3 steps, not their default 10 (the fewest the tool takes): 2 of warm-up and 1 on the decaying
# schedule, and the validation loss after the third update, compare every layout's updates, gradient
# accumulation and optimizer moments with one process's; the tables cost about linearly in steps (10 → 5
# halved them), and they were the suite's longest tests (CI's 20 minutes). `python -m hpctrain.verify.parity`
# runs the 10.
SUITE_STEPS = 3


def _table_matches_one_process(models: tuple[str, ...]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hpctrain.verify.parity", "--models", *models, "--steps", str(SUITE_STEPS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    print(result.stdout)
    rows = {}
    names = sorted((case.name for case in [*CASES, *EXTRA_CASES]), key=len, reverse=True)
    for line in result.stdout.splitlines():
        model, _, rest = line.partition(" ")
        name = next((n for n in names if rest.lstrip().startswith(n + " ")), None)
        if model in models and name is not None:
            rows[(model, name)] = line
    expected = [
        (model, case.name) for case in [*CASES, *EXTRA_CASES] for model in case.models if model in models
    ]
    missing = [key for key in expected if key not in rows]
    assert not missing, f"rows missing from the table: {missing}\n{result.stdout}\n{result.stderr[-3000:]}"
    failing = [rows[key] for key in expected if not rows[key].endswith("yes")]
    assert not failing, "\n".join(failing)
    assert result.returncode == 0, result.stderr[-3000:]


# The tables are the suite's longest tests: on a busy machine, beside the Slurm tier's jobs (the other xdist
# worker), they need more than pyproject's 600 s; bounded all the same.
@pytest.mark.timeout(1500)
def test_every_layout_matches_one_process():
    _table_matches_one_process(("gpt", "vit"))


@pytest.mark.timeout(1500)
def test_context_experts_and_adapters_match_one_process():
    """Issue 31's rows: cp 2, cp 4, cp 2 × tp 2, cp 2 × fsdp 2 at seq 1024; a mixture of experts under ep 2,
    ep 2 × fsdp 2, ep 2 × tp 2, tp + sp and 4d; LoRA under ddp, fsdp, pp, tp and tp + sp."""
    _table_matches_one_process(("gpt_long", "gpt_moe", "gpt_lora"))
    assert set(MODELS) == {"gpt", "vit", "gpt_long", "gpt_moe", "gpt_lora"}  # every model in one of the two


# Same model, data and global batch under every layout; only the degrees and micro-batches change.
MODEL = [
    *MODELS["gpt"],
    "data=synthetic",
    "data.num_samples=512",
    "trainer.global_batch_size=8",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.ckpt_every=3",
    "trainer.max_steps=5",
    "optim.warmup_steps=2",
    "logger=jsonl",
]
LAYOUT_3D = [*LAYOUTS["3d (pp 2 × fsdp 2 × tp 2)"].args(), "trainer.micro_batch_size=2"]
LAYOUT_FSDP = [*LAYOUTS["fsdp zero3"].args(), "trainer.micro_batch_size=4"]
LAYOUT_NONE = [*LAYOUTS["none"].args(), "trainer.micro_batch_size=4"]  # 2 micro-batches


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 * abs(b)


def test_checkpoint_moves_from_3d_to_fsdp_to_one_process(tmp_path: Path):
    """3d (pp 2 × fsdp 2 × tp 2) saves step 3; fsdp on 2 ranks resumes it and saves steps 4 and 5; one
    process resumes step 4. Each step's loss, and the final validation loss, equal the uninterrupted 3d
    run's. (Every run has the same max_steps: it shapes the learning-rate schedule.)"""
    full = tmp_path / "3d"
    result = hpctrain(*MODEL, *LAYOUT_3D, f"hydra.run.dir={full}", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    fsdp = tmp_path / "fsdp"
    resume = full / "checkpoints" / "step_00000003"
    result = hpctrain(
        *MODEL, *LAYOUT_FSDP, "trainer.ckpt_every=1", f"trainer.resume={resume}", f"hydra.run.dir={fsdp}"
    )
    assert result.returncode == 0, result.stderr[-3000:]

    single = tmp_path / "none"
    resume = fsdp / "checkpoints" / "step_00000004"
    result = hpctrain(*MODEL, *LAYOUT_NONE, f"trainer.resume={resume}", f"hydra.run.dir={single}")
    assert result.returncode == 0, result.stderr[-3000:]

    expected = {r["step"]: r for r in metrics(full)}
    for run, steps in ((fsdp, [4, 5]), (single, [5])):
        records = metrics(run)
        assert [r["step"] for r in records] == steps, run.name
        for r in records:
            assert _close(r["loss"], expected[r["step"]]["loss"]), (run.name, r, expected[r["step"]])
        assert _close(records[-1]["val_loss"], expected[5]["val_loss"]), (run.name, records[-1], expected[5])
