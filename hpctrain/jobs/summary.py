"""What a run or a sweep has done so far, read from its run directories (and Slurm for a sweep's states):
the step reached, the last value of a metric, one row per member. No torch import here."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpctrain.jobs.targets import LOCAL, local_states, states_of
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import read_json
from hpctrain.rundir.records import SweepMember, SweepRecord
from hpctrain.slurm.commands import JobState


def last_with(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get(key) is not None), None)


def progress(run_dir: Path, records: list[dict[str, Any]]) -> str:
    from hpctrain.rundir.runs import is_script

    last = records[-1]["step"] if records else "-"
    total = None if is_script(run_dir) else RunDir(run_dir).max_steps()  # a script's steps are its own
    return f"{last}/{total}" if total is not None else str(last)


def sweep_states(sweep: SweepRecord) -> dict[str, JobState]:
    """Every member's state, by its run directory: the word of :mod:`hpctrain.jobs.states` (the same for an
    array and a sweep run here) for the job that runs it (a pack's member: see :func:`pack_member_state`), or
    what a local sweep's run directories say."""
    if sweep.array_job_id == LOCAL:  # a sweep run here (hpctrain.jobs.targets.local_sweep)
        local = local_states(sweep)
        return {m.run_dir: local[m.job_id] for m in sweep.members if m.job_id in local}
    from hpctrain.jobs.states import run_state

    jobs = states_of([m.job_id for m in sweep.members])
    states = {}
    for member in sweep.members:
        job = jobs.get(member.job_id)
        if job is not None:
            if member.pack is None:
                states[member.run_dir] = replace(job, state=run_state(Path(member.run_dir), job).word)
            else:
                states[member.run_dir] = pack_member_state(member, job)
    return states


def pack_member_state(member: SweepMember, job: JobState) -> JobState:
    """One member of a pack (``cluster.pack``): its job runs several members in turn, so the member's own
    state comes from its run directory: COMPLETED at max_steps, FAILED with a rank's error, RUNNING while
    its lock is held, else what its job is doing (PENDING in a running job: its turn has not come)."""
    from hpctrain.rundir import RunLock

    run = RunDir(Path(member.run_dir))
    records = run.read_metrics(64 * 1024)
    step = records[-1].get("step", 0) if records else 0
    total = run.max_steps()
    if total is not None and step >= total:
        word, reason = "COMPLETED", ""
    elif RunLock(run.path).is_held():
        word, reason = "RUNNING", ""
    elif run.error_files() and job.state != "PENDING":
        word, reason = "FAILED", ""
    elif job.state == "RUNNING":
        word, reason = "PENDING", "earlier members of its pack"
    elif job.state == "COMPLETED":
        word, reason = "FAILED", ""  # the pack ended without this member reaching max_steps
    else:
        word, reason = job.state, job.reason
    return JobState(job.job_id, word, job.exit_code, job.nodes, job.elapsed, reason, job.start)


def summary_rows(sweep: SweepRecord, states: dict[str, JobState]) -> tuple[list[str], list[dict[str, Any]]]:
    """One dict per member (CSV-ready values; None for what is unknown), and the columns in use."""
    rows = []
    for member in sweep.members:
        records = RunDir(Path(member.run_dir)).read_metrics()
        vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
        accs = [r["val_acc"] for r in records if r.get("val_acc") is not None]
        last_loss = last_with(records, "loss")
        state = states.get(member.run_dir)
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
        evals = RunDir(Path(member.run_dir)).read_evals()  # hpctrain eval's, of the latest step evaluated
        last_eval = max(evals, key=lambda r: r["step"]) if evals else None
        row["eval_step"] = last_eval["step"] if last_eval else None
        row["eval_val_loss"] = last_eval.get("val_loss") if last_eval else None
        goodput = read_json(RunDir(Path(member.run_dir)).goodput)  # written as each attempt ends
        row["ettr"] = round(goodput["ettr"], 3) if isinstance(goodput, dict) and "ettr" in goodput else None
        row["run_dir"] = member.run_dir
        rows.append(row)
    optional = (
        "best_val_acc",
        "last_val_acc",
        "tokens_per_s",
        "samples_per_s",
        "eval_step",
        "eval_val_loss",
        "ettr",
    )
    columns = [k for k in rows[0] if k not in optional or any(r[k] is not None for r in rows)] if rows else []
    return columns, rows
