"""Issue 15: every layout for every model. A transformers Llama (its own tensor- and pipeline-parallel
plans) and a user's plain PyTorch model (nothing declared: a plan on the command line, the pipeline split
found from its block list) train under tp, pp and 3d like one process. Run from a copy of
examples/user_project, as a user would. (What cannot be split: tests/unit/parallel/test_split_refusals.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.user_project import SHORT, losses, user

STEPS = ["trainer.max_steps=4", "trainer.global_batch_size=8", "optim.warmup_steps=2", "data.max_bytes=60000"]
LAYOUTS = {
    "one": ["parallel=none", "cluster.nproc=1", "trainer.micro_batch_size=8"],
    "tp": ["parallel=tp", "cluster.nproc=2", "trainer.micro_batch_size=8"],
    "pp": ["parallel=pp", "cluster.nproc=2", "trainer.micro_batch_size=2"],
    "3d": ["parallel=3d", "cluster.nproc=8", "parallel.microbatches=2", "trainer.micro_batch_size=2"],
}
MIXER_TP = "parallel.tp_plan={blocks.*.up: colwise, blocks.*.down: rowwise}"


def _close(ours: dict[int, float], reference: dict[int, float]) -> float:
    assert ours.keys() == reference.keys(), (ours, reference)
    return max(abs(ours[s] - reference[s]) / abs(reference[s]) for s in reference)


@pytest.mark.parametrize(
    ("model", "layouts"),
    # Llama under 3d: its tensor-parallel plan (transformers' _tp_plan), its pipeline split (its
    # base_model_pp_plan) and FSDP in one run; tp and pp alone each cost a launch of ranks importing
    # transformers and test nothing 3d does not (the plain model below still runs them one at a time).
    [("llama_tiny", ["3d"]), ("mixer", ["tp", "pp"])],
    ids=["transformers-llama", "plain-pytorch"],
)
def test_any_model_trains_under_tp_pp_3d_like_one_process(
    project: Path,
    tmp_path: Path,
    model: str,
    layouts: list[str],
):
    common = [f"model={model}", "data=bytes", *SHORT, *STEPS]
    if model == "mixer":
        common.append(MIXER_TP)
    runs = {}
    for name in ["one", *layouts]:
        run = tmp_path / name
        result = user(project, *common, *LAYOUTS[name], f"hydra.run.dir={run}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = losses(run)
    gaps = {name: _close(runs[name], runs["one"]) for name in layouts}
    print(model, gaps)
    assert all(gap <= 1e-5 for gap in gaps.values()), gaps
