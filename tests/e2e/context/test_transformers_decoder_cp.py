"""Context parallelism of a transformers decoder built from a config (the user project's Llama, rotary
positions, grouped-query attention): its plan comes from its own layers (hpctrain.models.hf.context_plan),
and cp=2 trains as one process does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.user_project import losses, user

RUN = [
    "model=llama_tiny",
    "data=bytes",
    "data.max_bytes=60000",
    "trainer.max_steps=3",
    "trainer.global_batch_size=4",
    "trainer.micro_batch_size=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "logger=jsonl",
]


def test_a_llama_under_cp_2_trains_as_one_process(project: Path, tmp_path: Path) -> None:
    one, cp = tmp_path / "one", tmp_path / "cp"
    done = user(project, *RUN, "cluster.nproc=1", "parallel=none", f"hydra.run.dir={one}")
    assert done.returncode == 0, done.stderr[-3000:]
    done = user(project, *RUN, "cluster.nproc=2", "parallel=cp", f"hydra.run.dir={cp}")
    assert done.returncode == 0, done.stderr[-3000:]
    ref, got = losses(one), losses(cp)
    assert sorted(got) == [1, 2, 3]
    for step, loss in ref.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step
