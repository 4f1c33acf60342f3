"""Tied embeddings under pipeline parallelism (Megatron's embedding group, hpctrain.parallel.shared).

The first and the last stage each hold a copy of the tied token embedding / LM head weight; their gradients
are summed every step, the gradient norm counts the weight once and checkpoints save it once under
``tok_emb.weight``. So a tied GPT trains under pipeline layouts like one process (fp32: losses within 1e-5,
relative), and its checkpoints move between pipeline layouts, FSDP and one process.

One uninterrupted single-process run is the reference of every comparison; every run has the same global
batch (8) and max_steps (the learning-rate schedule).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import hpctrain, metrics
from test_parallel import MODEL

from hpctrain.verify.layouts import LAYOUTS

# test_parallel's run (4 layers, d_model 64, seq 32, 5 steps, a checkpoint at step 3), its embedding tied.
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
    one process's. (The parity table, tests/test_parallel.py, also runs the tied V-schedule and 3d layouts
    against one process.)"""
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


def test_tied_pipeline_config_is_accepted_and_planned_with_a_copy_on_the_last_stage():
    """No refusal any more, and the planner counts the V × d weight on the first and on the last stage (each
    holds a copy): per pipeline rank as much as untied; without a pipeline, once."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.config.validate import validate
    from hpctrain.plan.estimate import Estimate, estimate

    def planned(*overrides: str) -> Estimate:
        cfg = to_typed(compose(["model=gpt2_124m", *overrides]))
        validate(cfg)
        return estimate(cfg)

    tied = planned("parallel=pp", "cluster.nproc=2")
    untied = planned("parallel=pp", "cluster.nproc=2", "model.tie_embeddings=false")
    assert [(r.params, r.param_tensors) for r in tied.ranks] == [
        (r.params, r.param_tensors) for r in untied.ranks
    ]
    one = planned("parallel=none", "cluster.nproc=1")
    assert one.largest.params == 4 * 124_475_904  # the tied weight once
    assert tied.n_params == one.n_params == untied.n_params - 50304 * 768  # the copy is no new parameter


def test_the_tie_is_found_generically_and_saved_once():
    """The pipeline finds the tie from the whole model (one parameter under two names) and the stages that
    keep each name; the stages' copies are saved under the whole model's name."""
    import torch

    from hpctrain.checkpoint.state import ModelOptimizerState
    from hpctrain.models.builtin import GPTSpec
    from hpctrain.models.gpt import GPT
    from hpctrain.parallel.pipeline import dropped_modules, split_stage
    from hpctrain.parallel.shared import saved_names, stage_ties, tied_parameters

    model = GPT(GPTSpec(n_layers=4, d_model=16, n_heads=2, seq_len=8, vocab_size=32))
    ties = tied_parameters(model)
    assert ties == [["tok_emb.weight", "head.weight"]]
    across = stage_ties(ties, [dropped_modules(model, s, 4) for s in range(4)])
    assert [(t.names, t.holders, t.weight_stage) for t in across] == [
        (("tok_emb.weight", "head.weight"), {0: "tok_emb.weight", 3: "head.weight"}, 0)
    ]
    assert saved_names(ties, across, [3]) == {"head.weight": "tok_emb.weight"}
    last = split_stage(model, 3, 4)
    assert torch.equal(last.head.weight, model.tok_emb.weight) and last.tok_emb is None
    optimizer = torch.optim.AdamW(last.parameters())
    saved = ModelOptimizerState(last, optimizer, saved_names(ties, across, [3])).state_dict()
    assert "tok_emb.weight" in saved["model"] and "head.weight" not in saved["model"]
    whole = ModelOptimizerState(model, torch.optim.AdamW(model.parameters()), saved_names(ties, [], [0]))
    assert "head.weight" not in whole.state_dict()["model"]  # torch lists a tied parameter under both names
