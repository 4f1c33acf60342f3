"""What a run or a sweep has done so far, read from its run directories (and Slurm for a sweep's states):
the step reached, the last value of a metric, one row per member. No torch import here."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hpctrain.jobs.targets import LOCAL, local_states, states_of
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import SweepRecord
from hpctrain.slurm.commands import JobState


def last_with(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get(key) is not None), None)


def progress(run_dir: Path, records: list[dict[str, Any]]) -> str:
    from hpctrain.jobs.states import is_script

    last = records[-1]["step"] if records else "-"
    total = None if is_script(run_dir) else RunDir(run_dir).max_steps()  # a script's steps are its own
    return f"{last}/{total}" if total is not None else str(last)


def sweep_states(sweep: SweepRecord) -> dict[str, JobState]:
    """Every member's state word (:mod:`hpctrain.jobs.states`: the same for an array and a sweep run here),
    from Slurm or from the members' run directories."""
    if sweep.array_job_id == LOCAL:  # a sweep run here (hpctrain.jobs.targets.local_sweep)
        return local_states(sweep)
    from dataclasses import replace

    from hpctrain.jobs.states import run_state

    states = states_of([m.job_id for m in sweep.members])
    runs = {m.job_id: Path(m.run_dir) for m in sweep.members}
    return {job: replace(state, state=run_state(runs.get(job), state).word) for job, state in states.items()}


def summary_rows(sweep: SweepRecord, states: dict[str, JobState]) -> tuple[list[str], list[dict[str, Any]]]:
    """One dict per member (CSV-ready values; None for what is unknown), and the columns in use."""
    rows = []
    for member in sweep.members:
        records = RunDir(Path(member.run_dir)).read_metrics()
        vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
        accs = [r["val_acc"] for r in records if r.get("val_acc") is not None]
        last_loss = last_with(records, "loss")
        state = states.get(member.job_id)
        row: dict[str, Any] = {
            "index": member.index,
            "overrides": " ".join(member.overrides),
            "job_id": member.job_id,
            "state": state.state if state else None,
            "step": records[-1]["step"] if records else None,
            "loss": last_loss["loss"] if last_loss else None,
            "best_val_loss": min(vals) if vals else None,
            "last_val_loss": vals[-1] if vals else None,
            "best_val_acc": max(accs) if accs else None,
            "last_val_acc": accs[-1] if accs else None,
        }
        for key in ("tokens_per_s", "samples_per_s"):
            # The median over logged steps: the first steps (compilation, warm-up) do not skew it.
            values = [r[key] for r in records if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["run_dir"] = member.run_dir
        rows.append(row)
    optional = ("best_val_acc", "last_val_acc", "tokens_per_s", "samples_per_s")
    columns = [k for k in rows[0] if k not in optional or any(r[k] is not None for r in rows)] if rows else []
    return columns, rows
