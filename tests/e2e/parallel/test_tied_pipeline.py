"""Tied embeddings under pipeline parallelism (Megatron's embedding group, hpctrain.parallel.shared).

The first and the last stage each hold a copy of the tied token embedding / LM head weight; their gradients
are summed every step, the gradient norm counts the weight once and checkpoints save it once under
``tok_emb.weight``. So a tied GPT trains under pipeline layouts like one process (fp32: losses within 1e-5,
relative), and its checkpoints move between pipeline layouts, FSDP and one process. (The tie found and saved
once: tests/unit/parallel/test_shared.py; planned with a copy: tests/unit/plan/test_estimate.py.)

One uninterrupted single-process run is the reference of every comparison; every run has the same global
batch (8) and max_steps (the learning-rate schedule).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.verify.layouts import LAYOUTS
from tests.e2e.parallel.test_layouts import MODEL
from tests.support import hpctrain, metrics

# test_layouts's run (4 layers, d_model 64, seq 32, 5 steps, a checkpoint at step 3), its embedding tied.
COMMON = [*MODEL, "model.tie_embeddings=true"]
MB2 = "trainer.micro_batch_size=2"
ONE = [*LAYOUTS["none"].args(), "trainer.micro_batch_size=4"]  # 2 passes of 4
PP_1F1B = [*LAYOUTS["pp 1f1b"].args(), MB2]  # 4 micro-batches of 2
FSDP = [*LAYOUTS["fsdp zero3"].args(), "trainer.micro_batch_size=4"]
ZBV = [*LAYOUTS["pp zbv zero bubble"].args(), MB2]  # first and last stage both on rank 0


def _run(directory: Path, *layout: str, timeout: float = 300) -> list[dict]:
    result = hpctrain(*COMMON, *layout, f"hydra.run.dir={directory}", timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return metrics(directory)


def _gap(ours: list[dict], reference: dict[int, dict], key: str = "loss") -> float:
    """The largest relative difference of ``key`` between the records and the reference's same steps."""
    return max(abs(r[key] - reference[r["step"]][key]) / abs(reference[r["step"]][key]) for r in ours)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The uninterrupted runs, shared by the tests of this file (each trains once)."""
    root = tmp_path_factory.mktemp("tied")
    dirs = {name: root / name for name in ("one", "pp")}
    _run(dirs["one"], *ONE)
    _run(dirs["pp"], *PP_1F1B)
    return dirs


def _reference(runs: dict[str, Path]) -> dict[int, dict]:
    records = {r["step"]: r for r in metrics(runs["one"])}
    assert sorted(records) == [1, 2, 3, 4, 5]
    return records


def test_tied_pipeline_matches_one_process(runs: dict[str, Path]):
    """pp 2 (1F1B): losses, gradient norms (the weight counted once) and the final validation loss equal
    one process's. (The parity table, tests/e2e/parallel/test_layouts.py, also runs the tied V-schedule and
    3d layouts against one process.)"""
    reference, records = _reference(runs), metrics(runs["pp"])
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert _gap(records, reference) <= 1e-5
    assert _gap(records, reference, "grad_norm") <= 1e-5
    assert _gap(records[-1:], reference, "val_loss") <= 1e-5


@pytest.mark.parametrize(
    ("source", "layout"),
    [("pp", FSDP), ("pp", ONE)],
    ids=["pp checkpoint under fsdp", "pp checkpoint under none"],
)
def test_tied_pipeline_checkpoint_resumes_elsewhere(
    runs: dict[str, Path], tmp_path: Path, source: str, layout: list[str]
):
    """A pipeline checkpoint (the LM head's copy saved once, as ``tok_emb.weight``) resumes at step 3 under
    FSDP and under one process; steps 4 and 5 equal the uninterrupted run's."""
    resume = runs[source] / "checkpoints" / "step_00000003"
    records = _run(tmp_path / "resumed", *layout, f"trainer.resume={resume}")
    assert [r["step"] for r in records] == [4, 5]
    assert _gap(records, _reference(runs)) <= 1e-5
    assert _gap(records[-1:], _reference(runs), "val_loss") <= 1e-5


def test_one_process_checkpoint_resumes_under_the_v_schedule(runs: dict[str, Path], tmp_path: Path):
    """And back: one process's checkpoint (the tied weight once) fills both copies of the V schedule, whose
    first and last stages share rank 0 (the copies' gradients summed locally)."""
    resume = runs["one"] / "checkpoints" / "step_00000003"
    records = _run(tmp_path / "zbv", *ZBV, f"trainer.resume={resume}")
    assert [r["step"] for r in records] == [4, 5]
    assert _gap(records, _reference(runs)) <= 1e-5
