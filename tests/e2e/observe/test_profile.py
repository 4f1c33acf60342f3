"""A profiler window (hpctrain.observe.profile) writes a trace per rank beside TensorBoard's scalars
(hpctrain.observe.loggers), on 2 real ranks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import FAST, hpctrain, metrics


def test_a_profiler_window_writes_a_trace_per_rank_beside_tensorboards_scalars(run_dir: Path):
    """With logger=tensorboard (and the console and metrics.jsonl: loggers combine), the event file holds
    every number of metrics.jsonl at every logged step, and the traces go where TensorBoard's profiler
    plugin looks (issue 17, item 2)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpctrain.observe.loggers import tensorboard_tag

    result = hpctrain(
        *FAST,
        "cluster.nproc=2",
        "trainer.max_steps=4",
        "trainer.profile=2:3",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "logger=[console,tensorboard,jsonl]",
        f"hydra.run.dir={run_dir}",
    )
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
