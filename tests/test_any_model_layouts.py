"""Issue 15: every layout for every model. A transformers Llama (its own tensor- and pipeline-parallel
plans) and a user's plain PyTorch model (nothing declared: a plan on the command line, the pipeline split
found from its block list) train under tp, pp and 3d like one process; what cannot be split is refused in
one line. Run from a copy of examples/user_project, as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_byo import SHORT, losses, project, user  # noqa: F401  (project: the fixture)

from hpctrain.cli import main

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
    project: Path,  # noqa: F811
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


PLAIN = ["model=mixer", "data=bytes", *SHORT, *STEPS, "trainer.micro_batch_size=2"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["parallel=tp", "cluster.nproc=2"], "parallel.tp=2: model TokenMLP has no tensor-parallel plan"),
        (
            ["parallel=pp", "cluster.nproc=2", "model._target_=mynets.bad.Pooled"],
            "model Pooled is not input ['embed'] → blocks blocks → output ['norm', 'head']",
        ),
        (["parallel=pp", "parallel.pp_split={blocks: embed}"], "parallel.pp_split.blocks=embed: is not an"),
        (["parallel=pp", "parallel.pp_split={blocks: nosuch}"], "parallel.pp_split=nosuch: names no module"),
        (["parallel=pp", "parallel.pp_split={input: [embed]}"], "parallel.pp_split.blocks=null: missing"),
        (
            ["parallel=pp", "parallel.pp_split={blocks: 'a b'}"],
            "parallel.pp_split.blocks=a b: not a module name",
        ),
        (
            ["parallel=pp", "parallel.pp_split={stages: 2, blocks: blocks}"],
            "parallel.pp_split.stages=2: unknown",
        ),
        (["parallel=pp", "model.depth=1"], "parallel.pp=2: blocks of TokenMLP holds 1 blocks"),
        (["parallel=pp", "model=llama_tiny", "loss=model"], "loss=model: under pipeline parallelism"),
    ],
    ids=lambda v: v if isinstance(v, str) and "=" not in v else None,
)
def test_what_cannot_be_split_is_one_line(
    project: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
):
    """In this process (the same precheck the CLI runs, without an interpreter start per case)."""
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    code = main(["--config-dir", "conf", *PLAIN, *args, f"hydra.run.dir={tmp_path / 'r'}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), lines
    assert words in lines[0], lines
    assert not (tmp_path / "r").exists()
