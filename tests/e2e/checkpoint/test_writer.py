"""A checkpoint writer process killed mid-write (SIGKILL): its checkpoint is never committed, the one before
stays the newest, and training goes on with a warning (``checkpoint.on_writer_failure=warn``) or stops in one
line (``stop``)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.rundir import checkpoints as layout
from tests.support import FAST, hpctrain, metrics

RUN = [
    *FAST,
    "cluster.nproc=2",
    "trainer.max_steps=8",
    "trainer.ckpt_every=2",
    "trainer.keep_last=8",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.async_checkpoint=true",
    "faults.writer_kill_at=1:4",  # rank 1's writer kills itself while writing step 4
]


def test_a_killed_writer_loses_its_checkpoint_only_and_training_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = hpctrain(*RUN, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    names = [p.name for p in layout.committed(run / "checkpoints")]
    assert names == ["step_00000008", "step_00000006", "step_00000002"], names
    assert [r["step"] for r in metrics(run)] == list(range(1, 9))
    log = (run / "logs" / "rank0.log").read_text()
    warning = log.split("Checkpoint writer failed while writing step_00000004 (")[1].splitlines()[0]
    # Rank 0's writer may fail too, its peer gone mid-collective: the line names every rank's failure.
    assert "rank 1: the writer process died (killed by SIGKILL)" in warning
    assert warning.endswith(
        "it was not committed, step_00000002 stays the newest checkpoint; training goes on with new writers "
        "(checkpoint.on_writer_failure=warn)"
    )
    assert "Committed step_00000006" in log and "Committed step_00000004" not in log
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_a_killed_writer_stops_the_run_in_one_line_when_asked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = hpctrain(*RUN, "checkpoint.on_writer_failure=stop", f"hydra.run.dir={run}")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "CheckpointWriterFailed" in lines[0] and "step_00000004" in lines[0]
    assert "(checkpoint.on_writer_failure=stop)" in lines[0] and "alike" in lines[0]
    assert [p.name for p in layout.committed(run / "checkpoints")] == ["step_00000002"]
