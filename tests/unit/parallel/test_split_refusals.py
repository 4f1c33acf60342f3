"""Issue 15: what cannot be split is refused in one line, before anything starts: a model without a tensor-
parallel plan, a forward the pipeline stages cannot reproduce, a ``parallel.pp_split`` that names nothing or
too few blocks (hpctrain.parallel.stages, hpctrain.parallel.tp, checked by the precheck). In this process,
from a copy of examples/user_project (tests/conftest.py's ``project``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main

STEPS = ["trainer.max_steps=4", "trainer.global_batch_size=8", "optim.warmup_steps=2", "data.max_bytes=60000"]
SHORT = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.eval_batches=1", "logger=jsonl"]
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
    in_project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
):
    """In this process (the same precheck the CLI runs, without an interpreter start per case)."""
    code = main(["--config-dir", "conf", *PLAIN, *args, f"hydra.run.dir={tmp_path / 'r'}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("hpctrain: "), lines
    assert words in lines[0], lines
    assert not (tmp_path / "r").exists()
