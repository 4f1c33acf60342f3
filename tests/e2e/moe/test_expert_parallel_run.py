"""A mixture of experts through the real command line: 2 processes with parallel.ep=2 log what the routers did
(metrics.jsonl: each expert's share, assignments dropped, the load-balancing loss), checkpoint, fail, and
the run resumes on one process (ep=1): the experts' weights reshard from two ranks' halves to one whole, and
the losses follow an uninterrupted one-process run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import hpctrain, metrics

MOE = [
    "model=gpt_moe",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.seq_len=32",
    "model.moe.experts=4",
    "model.moe.top_k=2",
    "data=synthetic",
    "data.num_samples=256",
    "trainer.max_steps=8",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "trainer.log_every=1",
    "trainer.ckpt_every=4",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "logger=jsonl",
]
# One pass of the whole batch, as the two ranks' passes together: the load-balancing loss is a product of
# shares over the tokens of one forward, so the same tokens must share it.
ONE_PROCESS = ["cluster.nproc=1", "parallel=none", "trainer.micro_batch_size=8"]


def test_ep_2_logs_router_stats_and_resumes_on_one_process(tmp_path: Path) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    reference = hpctrain(*MOE, *ONE_PROCESS, f"hydra.run.dir={ref}")
    assert reference.returncode == 0, reference.stderr
    first = hpctrain(
        *MOE,
        "cluster.nproc=2",
        "parallel=fsdp",
        "parallel.ep=2",
        "faults.fail_at=0:5",
        f"hydra.run.dir={run}",
    )
    assert first.returncode == 1 and "injected failure at step 5" in first.stderr, first.stderr
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for record in records:
        load = record["moe_load"]
        # 2 layers × 8 samples × 32 tokens × top-2 assignments, spread over the 4 experts.
        assert len(load) == 4 and sum(load) == pytest.approx(1.0, abs=1e-5) and min(load) > 0
        assert record["moe_dropped"] == 0  # dropless
        # Switch's loss is E · Σ f·P ≥ 1 (1 exactly when balanced); a random router stays near 1.
        assert 1.0 <= record["moe_aux_loss"] < 2.0
    second = hpctrain(*MOE, *ONE_PROCESS, f"hydra.run.dir={run}")
    assert second.returncode == 0, second.stderr
    assert "Resumed from" in (run / "logs" / "rank0.log").read_text()
    losses = {r["step"]: r["loss"] for r in metrics(run)}
    ref_records = metrics(ref)
    assert sorted(losses) == list(range(1, 9))
    for r in ref_records:
        assert losses[r["step"]] == pytest.approx(r["loss"], rel=1e-5), r["step"]
    # The router's statistics of the resumed steps are those of the uninterrupted run (same weights, tokens).
    resumed = {r["step"]: r for r in metrics(run)}
    for r in ref_records[4:]:
        assert resumed[r["step"]]["moe_load"] == pytest.approx(r["moe_load"], abs=1e-5)


def test_the_headline_plans_its_degrees_and_a_4d_run_on_8_processes_completes(tmp_path: Path) -> None:
    plan = hpctrain(
        "model=gpt_moe",
        "parallel=4d",
        "cluster=h100x64",
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'plan'}",
    )
    assert plan.returncode == 0, plan.stderr
    assert "parallel=4d (pp=2 × dp_shard=8 × cp=2 × tp=2)" in plan.stdout
    table = hpctrain("plan", "model=gpt_moe", "parallel=4d", "cluster=h100x64", "--top", "0")
    assert table.returncode == 0, table.stderr
    assert "active per token of" in table.stdout  # the planner counts a mixture's active parameters
    assert "CP ring" in table.stdout and "TP collectives" in table.stdout
    run = tmp_path / "run"
    done = hpctrain(
        *MOE[:7],
        "data=synthetic",
        "data.num_samples=128",
        "trainer.max_steps=2",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=2",
        "trainer.log_every=1",
        "trainer.eval_every=0",
        "trainer.eval_batches=1",
        "logger=jsonl",
        "cluster.nproc=8",
        "parallel=4d",
        f"hydra.run.dir={run}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2] and all(len(r["moe_load"]) == 4 for r in records)
