"""What ``hpctrain status`` and ``hpctrain cancel`` find and do: a run's job, its Slurm state, progress,
last loss and the error it died of; a sweep's members in a table; cancelling a job or an array. Each returns
its lines (the CLI prints them). No torch import here."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.jobs.control import describe as describe_control
from hpctrain.jobs.states import FAILED, RunState, run_state
from hpctrain.jobs.summary import last_with, progress, sweep_states
from hpctrain.jobs.targets import LOCAL, JobsError, Target, state_of, states_of
from hpctrain.observe.goodput import run_ledger, summary_line
from hpctrain.observe.text import table
from hpctrain.resilience import stacks
from hpctrain.rundir import JOB_RECORD, RunDir, eval_metrics
from hpctrain.rundir.records import SweepRecord, error_last_line, first_error, split_overrides
from hpctrain.rundir.runs import continue_command
from hpctrain.slurm import commands
from hpctrain.slurm.commands import JobState, SlurmUnavailable

EXIT_OK = 0
EXIT_FAILED = 1
TAIL_BYTES = 256 * 1024  # status reads only the end of metrics.jsonl


@dataclass
class Report:
    """Lines for stdout, problems for stderr (one line each), and the exit status."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    code: int = EXIT_OK


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def fmt(value: object, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def where(sweep: SweepRecord) -> str:
    if sweep.array_job_id == LOCAL:
        return "run here"
    arrays = sweep.arrays
    if len(arrays) == 1:
        return f"array job {arrays[0]} on {sweep.cluster}"
    return f"{len(arrays)} array jobs {', '.join(arrays)} on {sweep.cluster}"


# ---------------------------------------------------------------------------------------------- status


def status(target: Target) -> Report:
    """``hpctrain status`` of a run or a sweep: its lines, the problems met on the way, the exit status."""
    if target.is_sweep:
        return _status_sweep(target)
    report = Report()
    out: list[tuple[str, str]] = []
    code = EXIT_OK
    job_id = target.slurm_id
    state: JobState | None = None
    run_word: RunState | None = None
    if target.run_dir is not None:
        out.append(("run", str(target.run_dir)))
    if job_id is not None:
        job = target.job
        detail = ""
        if job is not None and job.nodes:
            size = f"{plural(job.nodes, 'node')} × {plural(job.tasks_per_node, 'task')}"
            detail = f" ({job.launcher} on {job.cluster}: {size})"
        out.append(("job", job_id + detail))
        members: list[JobState] = []
        try:
            state, members = state_of(job_id)
        except JobsError as err:
            report.problems.append(str(err))
            code = EXIT_FAILED
        if state is None:
            out.append(("state", "UNKNOWN (not known to Slurm)" if code == EXIT_OK else "UNKNOWN"))
            code = EXIT_FAILED
        else:
            run_word = run_state(target.run_dir, state)
            word = str(run_word)
            if state.reason:
                word += f" ({state.reason})"
            elif state.final and state.exit_code not in ("", "0:0"):
                word += f" (exit code {state.exit_code})"
            out.append(("state", word))
            if state.start:  # a pending job: when Slurm's scheduler expects to start it
                out.append(("starts", f"{state.start} (Slurm's estimate)"))
            if members:
                out.append(("members", ", ".join(f"{m.job_id} {m.state}" for m in members)))
            else:
                out.append(("nodes", state.nodes or "-"))
                out.append(("elapsed", state.elapsed or "-"))
    else:
        run_word = run_state(target.run_dir)
        out.append(("state", str(run_word)))
    if run_word is not None and run_word.word == FAILED:
        code = EXIT_FAILED  # a script (or a person) can tell a failed run from the exit status
    if target.run_dir is not None:
        records = RunDir(target.run_dir).read_metrics(TAIL_BYTES)
        out.append(("step", progress(target.run_dir, records)))
        last_loss = last_with(records, "loss")
        out.append(("loss", fmt(last_loss["loss"]) if last_loss else "-"))
        last_val = last_with(records, "val_loss")
        if last_val is not None:
            val = f"{fmt(last_val['val_loss'])}"
            if last_val.get("val_acc") is not None:
                val += f", val_acc {fmt(last_val['val_acc'], 3)}"
            out.append(("val_loss", f"{val} (step {last_val['step']})"))
        evals = RunDir(target.run_dir).read_evals()
        if evals:  # hpctrain eval / trainer.eval_job: the latest checkpoint evaluated
            last = max(evals, key=lambda r: (r["step"], r.get("time", 0)))  # the latest of the latest step
            shown = ", ".join(f"{k} {fmt(v)}" for k, v in list(eval_metrics(last).items())[:4])
            out.append(("eval", f"{shown} (step {last['step']}; {plural(len(evals), 'evaluation')})"))
        for line in missed_evaluations(target.run_dir, evals):  # trainer.eval_job: never a silent gap
            out.append(("missing", line))
        control = describe_control(RunDir(target.run_dir).read_control())
        if control is not None:
            out.append(("control", control))
        restarts = RunDir(target.run_dir).read_answers()
        if restarts:  # its module imports launch, omegaconf, checkpoints: only for a run that restarted
            from hpctrain.launch.supervision import summary as restart_summary

            for i, line in enumerate(restart_summary(restarts)):
                out.append(("restarts" if i == 0 else "", line))
        book = run_ledger(target.run_dir, ask_slurm=job_id is not None)  # where its wall time went
        if book is not None:
            out.append(("goodput", summary_line(book).removeprefix("goodput: ")))
        dump = stacks.newest(target.run_dir)  # a hang's automatic dump, or the last hpctrain stacks
        if dump is not None:
            folder, found = dump
            out.append(("stacks", f"{'; '.join(stacks.group(found))} ({folder})"))
        failed = run_word is not None and run_word.word == FAILED
        if failed or (job_id is None and state is None):
            error = first_error(target.run_dir)
            if error is not None:
                rank, record = error
                host = f" on {record['host']}" if record.get("host") else ""
                out.append(("error", f"rank {rank}{host}: {error_last_line(record)}"))
                out.append(("", f"log: {RunDir(target.run_dir).log(rank)}"))
            elif failed:
                out.append(("error", "no rank recorded an error: see `hpctrain logs` and Slurm's output"))
        if run_word is not None and run_word.can_continue:
            out.append(("continue", continue_command(target.run_dir)))
    else:
        out.append(("run", "directory not found (from Slurm's output path)"))
    width = max(len(k) for k, _ in out)
    report.lines += [f"{key:<{width}}  {value}".rstrip() for key, value in out]
    report.code = code
    return report


def missed_evaluations(run_dir: Path, evals: list[dict[str, Any]]) -> list[str]:
    """``trainer.eval_job``: one line per step submitted for evaluation (``eval_pins/``) with no result in
    eval.jsonl whose job will not give one: it failed, was never submitted, or ended without reading its
    checkpoint. A job still pending or running is not missing; nor is one Slurm cannot be asked about."""
    done = {r["step"] for r in evals}
    pins = {s: p for s, p in RunDir(run_dir).read_eval_pins().items() if s not in done}
    unreleased = [str(p["job_id"]) for p in pins.values() if p.get("released") is None and p.get("job_id")]
    states: dict[str, JobState] = {}
    if unreleased:
        try:
            states = commands.job_states(unreleased)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError):
            return [_missed(s, p, p.get("released")) for s, p in sorted(pins.items()) if p.get("released")]
    lines = []
    for step, pin in sorted(pins.items()):
        why, job = pin.get("released"), pin.get("job_id")
        if why is None and job:
            state = states.get(str(job))
            if state is not None and not state.final:  # still to come
                continue
            ended = state.state if state is not None else "(unknown to Slurm)"
            why = f"the job ended {ended} before reading its checkpoint"
        elif why is None:
            continue  # being submitted (a dead training job's leftover is released by its run's next prune)
        lines.append(_missed(step, pin, why))
    return lines


def _missed(step: int, pin: dict[str, Any], why: str) -> str:
    job = f" (job {pin['job_id']})" if pin.get("job_id") else ""
    return f"evaluation of step {step}{job} missing: {why}"


def _status_sweep(target: Target) -> Report:
    sweep = target.sweep
    assert sweep is not None and target.sweep_dir is not None
    report = Report()
    try:
        states = sweep_states(sweep)
    except JobsError as err:
        report.problems.append(str(err))
        states, report.code = {}, EXIT_FAILED
    counts: dict[str, int] = {}
    for member in sweep.members:
        word = states[member.run_dir].state if member.run_dir in states else "UNKNOWN"
        counts[word] = counts.get(word, 0) + 1
    tally = ", ".join(f"{n} {word}" for word, n in counts.items())
    n = plural(len(sweep.members), "member")
    report.lines.append(f"sweep {target.sweep_dir}: {where(sweep)}, {n} ({tally})")
    common, own = split_overrides(sweep.members)
    if common:
        report.lines.append(f"common overrides: {' '.join(common)}")
    rows = []
    for member, overrides in zip(sweep.members, own, strict=True):
        run_dir = Path(member.run_dir)
        records = RunDir(run_dir).read_metrics(TAIL_BYTES)
        last_loss = last_with(records, "loss")
        state = states.get(member.run_dir)
        rows.append(
            [
                str(member.index),
                " ".join(overrides),
                member.job_id,
                state.state if state else "UNKNOWN",
                progress(run_dir, records),
                fmt(last_loss["loss"]) if last_loss else "",
            ]
        )
    report.lines.append(table(["#", "overrides", "job", "state", "step", "loss"], rows, right=(0, 4, 5)))
    return report


# ---------------------------------------------------------------------------------------------- cancel


def cancel(target: Target) -> str:
    """Cancel a run's Slurm job, or every active member of a sweep; what was done, in one line."""
    if target.is_sweep:
        return _cancel_sweep(target)
    job_id = target.slurm_id
    if job_id is None:
        raise JobsError(f"{target.text} is a local run (no {JOB_RECORD}): stop it where it runs (Ctrl-C)")
    state, _ = state_of(job_id)
    if state is None:
        raise JobsError(f"job {job_id} is not known to Slurm")
    if state.final:
        return f"job {job_id} is already {state.state}: nothing to cancel"
    _scancel([job_id])
    where = f" on {state.nodes}" if state.nodes else ""
    run = f": {target.run_dir}" if target.run_dir is not None else ""
    return f"cancelled job {job_id} ({state.state}{where}){run}"


def _cancel_sweep(target: Target) -> str:
    sweep = target.sweep
    assert sweep is not None
    states = states_of([m.job_id for m in sweep.members])
    active = [m for m in sweep.members if m.job_id in states and not states[m.job_id].final]
    done = len(sweep.members) - len(active)
    arrays = sweep.arrays
    name = f"array job {arrays[0]}" if len(arrays) == 1 else f"array jobs {', '.join(arrays)}"
    if not active:
        return f"{name}: no member is queued or running: nothing to cancel"
    # Whole arrays where every member belongs to one (one scancel per array id), else member by member.
    whole = all(m.job_id.split("_")[0] in arrays for m in sweep.members)
    jobs = list(dict.fromkeys(m.job_id for m in active))
    _scancel(sorted({j.split("_")[0] for j in jobs}, key=arrays.index) if whole else jobs)
    listed = ", ".join(f"{m.job_id} {states[m.job_id].state}" for m in active)
    rest = f"; {done} already ended" if done else ""
    return f"cancelled {name}: {plural(len(active), 'member')} ({listed}){rest}"


def _scancel(job_ids: list[str]) -> None:
    try:
        commands.cancel(job_ids)
    except SlurmUnavailable as err:
        raise JobsError(str(err)) from None
    except (RuntimeError, OSError) as err:
        raise JobsError(f"scancel failed: {err}") from None
