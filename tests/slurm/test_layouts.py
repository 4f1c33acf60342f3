"""Issue 15, acceptance a: the headline command as typed. ``model=vit parallel=3d`` picks image data for
the ViT, splits its 17 tokens over tp=2 with sequence parallelism, and trains to the end as 8 tasks over
2 nodes of the test cluster."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.rundir.records import read_job
from tests.support import hpctrain, metrics

from .test_submit import wait_final


def test_vit_3d_as_typed_trains_on_two_nodes(slurm_cluster, tmp_path: Path):
    run = tmp_path / "run"
    result = hpctrain(
        "model=vit",
        "parallel=3d",
        "cluster=slurm_test",
        "cluster.tasks_per_node=4",
        "trainer.max_steps=3",
        "trainer.eval_batches=1",
        "logger=jsonl",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr
    assert "data=digits (model ViT takes images" in result.stderr + result.stdout
    record = read_job(run)
    assert record is not None and record.nodes == 2 and record.tasks_per_node == 4
    state = wait_final([record.job_id], timeout=400)[record.job_id]
    assert state.state == "COMPLETED", (state, (run / "logs" / "rank0.log").read_text()[-3000:])
    ranks = json.loads((run / "ranks.json").read_text())
    assert sorted(r["host"] for r in ranks) == ["node1"] * 4 + ["node2"] * 4
    assert metrics(run)[-1]["step"] == 3
    assert "pp=2 × dp_shard=2 × tp=2" in (run / "logs" / "rank0.log").read_text()
