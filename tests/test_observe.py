"""Issue 6: a straggler is named in the metrics; a profiler window leaves a trace per rank."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import FAST, hpctrain, metrics


def test_an_injected_straggler_is_named_in_the_metrics(run_dir: Path):
    result = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=6",
        "trainer.log_every=3",
        "trainer.straggler_every=3",
        "faults.slow_rank=0:0.3",  # rank 0 sleeps 0.3 s in the data phase of every step
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [r for r in metrics(run_dir) if "straggler_rank" in r]
    assert [r["step"] for r in reports] == [3, 6]
    hosts = {entry["rank"]: entry["host"] for entry in json.loads((run_dir / "ranks.json").read_text())}
    for report in reports:
        assert report["straggler_rank"] == 0, report
        assert report["straggler_host"] == hosts[0]
        assert report["straggler_phase"] == "data"
        assert report["data_s_max"] >= 0.3
        assert report["straggler_slowdown"] > 1.5
        # Rank 0 logs its own wait for batches, inside its step time (issue 18: data never waits).
        assert 0.3 <= report["data_wait_s"] <= report["step_time_s"], report
        # The throughput metrics beside it: per device too, and this rank's peak memory.
        per_device, total = report["tokens_per_s_per_device"], report["tokens_per_s"]
        assert abs(per_device - total / 2) < 1e-6 * total
        assert 0.05 < report["peak_mem_gib"] < 8
    assert "Straggler: rank 0" in (run_dir / "logs" / "rank0.log").read_text()


def test_without_a_straggler_the_slowdown_stays_small(run_dir: Path):
    result = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=4",
        "trainer.straggler_every=4",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = [r for r in metrics(run_dir) if "straggler_rank" in r]
    assert report["data_s_max"] < 0.1, report
    assert 0 <= report["data_wait_s"] < 0.1, report
    # Twice the median of a fraction of a millisecond is no straggler worth a warning (the 10 ms floor).
    assert "Straggler:" not in (run_dir / "logs" / "rank0.log").read_text()


def test_a_profiler_window_writes_a_trace_per_rank_beside_tensorboards_scalars(run_dir: Path):
    """With logger=tensorboard (and the console and metrics.jsonl: loggers combine), the event file holds
    every number of metrics.jsonl at every logged step, and the traces go where TensorBoard's profiler
    plugin looks (issue 17, item 2)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpctrain.observe.loggers import tensorboard_tag

    result = hpctrain(
        *FAST, "cluster.nproc=2", "trainer.max_steps=4", "trainer.profile=2:3", "trainer.log_every=1",
        "trainer.eval_every=2", "logger=[console,tensorboard,jsonl]", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("loss", "val_loss", "lr", "grad_norm"):
        logged = {r["step"]: r[key] for r in records if key in r}
        scalars = {e.step: e.value for e in events.Scalars(tensorboard_tag(key))}  # grouped: loss/train, ...
        assert scalars.keys() == logged.keys(), key
        assert all(abs(scalars[s] - v) <= 1e-6 * abs(v) for s, v in logged.items()), key  # float32 events
    assert {"loss/train", "loss/val", "optim/lr", "optim/grad_norm"} <= set(events.Tags()["scalars"])
    assert events.PluginTagToContent("hparams"), "the run's config as TensorBoard hparams"
    traces = sorted((run_dir / "tensorboard" / "plugins" / "profile" / "steps_2-3").glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"]
    for trace in traces:
        events = json.loads(trace.read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert any(n.startswith("aten::") for n in names), sorted(names)[:20]
        # Two steps: two optimizer steps, and the gradient all-reduces between the ranks.
        assert sum(e.get("name") == "Optimizer.step#AdamW.step" for e in events) == 2
        assert "gloo:all_reduce" in names
