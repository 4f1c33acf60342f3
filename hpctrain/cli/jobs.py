"""``hpctrain status | cancel | summary``: look after runs and sweeps once they are submitted.

A TARGET is a run directory (``job.json``; a local run has none and shows its progress only), a sweep
directory (``sweep.json``) or a Slurm job id (``123``, or ``123_4`` for one array member), whose run or sweep
directory is found from the job's output path while slurmctld still knows the job.
:mod:`hpctrain.jobs.targets` resolves it; ``hpctrain logs`` is :mod:`hpctrain.cli.logs`.

    hpctrain status TARGET                   job, Slurm state, nodes, elapsed, step / max_steps, loss, error
    hpctrain cancel TARGET                   scancel the run's job, or every member of a sweep
    hpctrain summary SWEEP_DIR [--csv PATH]  final metrics of every member, as a table and a CSV

Bad arguments are one line on stderr and exit status 2; a target that cannot be found or read, or a Slurm
query that fails, is one line on stderr and exit status 1. Runs on login nodes: no torch import here.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from hpctrain.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    JobsError,
    Parser,
    fmt,
    guarded,
    plural,
    table,
)
from hpctrain.jobs.summary import last_with, progress, summary_rows, sweep_states
from hpctrain.jobs.targets import LOCAL, TARGET_HELP, Target, resolve, state_of, states_of
from hpctrain.rundir import JOB_RECORD, SWEEP_RECORD, RunDir
from hpctrain.rundir.records import SweepRecord, error_last_line, first_error, split_overrides
from hpctrain.slurm import commands
from hpctrain.slurm.commands import JobState, SlurmUnavailable

TAIL_BYTES = 256 * 1024  # status reads only the end of metrics.jsonl

# ---------------------------------------------------------------------------------------------- metrics


# ---------------------------------------------------------------------------------------------- status


def status(target: Target) -> int:
    if target.is_sweep:
        return _status_sweep(target)
    out: list[tuple[str, str]] = []
    code = EXIT_OK
    job_id = target.slurm_id
    state: JobState | None = None
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
            print(f"hpctrain status: {err}", file=sys.stderr)
            code = EXIT_FAILED
        if state is None:
            out.append(("state", "UNKNOWN (not known to Slurm)" if code == EXIT_OK else "UNKNOWN"))
            code = EXIT_FAILED
        else:
            word = state.state
            if state.reason:
                word += f" ({state.reason})"
            elif state.final and state.exit_code not in ("", "0:0"):
                word += f" (exit code {state.exit_code})"
            out.append(("state", word))
            if members:
                out.append(("members", ", ".join(f"{m.job_id} {m.state}" for m in members)))
            else:
                out.append(("nodes", state.nodes or "-"))
                out.append(("elapsed", state.elapsed or "-"))
    else:
        out.append(("state", "local"))
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
        failed = state is not None and state.state == "FAILED"
        if failed or (job_id is None and state is None):
            error = first_error(target.run_dir)
            if error is not None:
                rank, record = error
                host = f" on {record['host']}" if record.get("host") else ""
                out.append(("error", f"rank {rank}{host}: {error_last_line(record)}"))
                out.append(("", f"log: {RunDir(target.run_dir).log(rank)}"))
            elif failed:
                out.append(("error", "no rank recorded an error: see `hpctrain logs` and Slurm's output"))
    else:
        out.append(("run", "directory not found (from Slurm's output path)"))
    width = max(len(k) for k, _ in out)
    for key, value in out:
        print(f"{key:<{width}}  {value}".rstrip())
    return code


def _status_sweep(target: Target) -> int:
    sweep = target.sweep
    assert sweep is not None and target.sweep_dir is not None
    code = EXIT_OK
    try:
        states = sweep_states(sweep)
    except JobsError as err:
        print(f"hpctrain status: {err}", file=sys.stderr)
        states, code = {}, EXIT_FAILED
    counts: dict[str, int] = {}
    for member in sweep.members:
        word = states[member.job_id].state if member.job_id in states else "UNKNOWN"
        counts[word] = counts.get(word, 0) + 1
    tally = ", ".join(f"{n} {word}" for word, n in counts.items())
    n = plural(len(sweep.members), "member")
    print(f"sweep {target.sweep_dir}: {_where(sweep)}, {n} ({tally})")
    common, own = split_overrides(sweep.members)
    if common:
        print(f"common overrides: {' '.join(common)}")
    rows = []
    for member, overrides in zip(sweep.members, own, strict=True):
        run_dir = Path(member.run_dir)
        records = RunDir(run_dir).read_metrics(TAIL_BYTES)
        last_loss = last_with(records, "loss")
        state = states.get(member.job_id)
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
    print(table(["#", "overrides", "job", "state", "step", "loss"], rows, right=(0, 4, 5)))
    return code


# ---------------------------------------------------------------------------------------------- cancel


def cancel(target: Target) -> int:
    if target.is_sweep:
        return _cancel_sweep(target)
    job_id = target.slurm_id
    if job_id is None:
        raise JobsError(f"{target.text} is a local run (no {JOB_RECORD}): stop it where it runs (Ctrl-C)")
    state, _ = state_of(job_id)
    if state is None:
        raise JobsError(f"job {job_id} is not known to Slurm")
    if state.final:
        print(f"job {job_id} is already {state.state}: nothing to cancel")
        return EXIT_OK
    _scancel([job_id])
    where = f" on {state.nodes}" if state.nodes else ""
    run = f": {target.run_dir}" if target.run_dir is not None else ""
    print(f"cancelled job {job_id} ({state.state}{where}){run}")
    return EXIT_OK


def _cancel_sweep(target: Target) -> int:
    sweep = target.sweep
    assert sweep is not None
    states = states_of([m.job_id for m in sweep.members])
    active = [m for m in sweep.members if m.job_id in states and not states[m.job_id].final]
    done = len(sweep.members) - len(active)
    if not active:
        print(f"array job {sweep.array_job_id}: no member is queued or running: nothing to cancel")
        return EXIT_OK
    whole_array = all(m.job_id.split("_")[0] == sweep.array_job_id for m in sweep.members)
    _scancel([sweep.array_job_id] if whole_array else [m.job_id for m in active])
    listed = ", ".join(f"{m.job_id} {states[m.job_id].state}" for m in active)
    rest = f"; {done} already ended" if done else ""
    print(f"cancelled array job {sweep.array_job_id}: {plural(len(active), 'member')} ({listed}){rest}")
    return EXIT_OK


def _scancel(job_ids: list[str]) -> None:
    try:
        commands.cancel(job_ids)
    except SlurmUnavailable as err:
        raise JobsError(str(err)) from None
    except (RuntimeError, OSError) as err:
        raise JobsError(f"scancel failed: {err}") from None


# ---------------------------------------------------------------------------------------------- summary


def _where(sweep: SweepRecord) -> str:
    return "run here" if sweep.array_job_id == LOCAL else f"array job {sweep.array_job_id} on {sweep.cluster}"


def summary(target: Target, csv_path: Path | None) -> int:
    sweep = target.sweep
    if sweep is None or target.sweep_dir is None:
        raise JobsError(f"{target.text}: not a sweep directory (no {SWEEP_RECORD})")
    try:
        states = sweep_states(sweep)
    except JobsError as err:  # the metrics are still worth showing (e.g. a copied sweep dir, no Slurm here)
        print(f"hpctrain summary: states unknown: {err}", file=sys.stderr)
        states = {}
    columns, rows = summary_rows(sweep, states)
    common, own = split_overrides(sweep.members)
    n = plural(len(sweep.members), "member")
    print(f"sweep {target.sweep_dir}: {_where(sweep)}, {n}")
    if common:
        print(f"common overrides: {' '.join(common)}")
    shown = [c for c in columns if c != "run_dir"]
    digits = {"best_val_acc": 3, "last_val_acc": 3}
    cells = []
    for row, overrides in zip(rows, own, strict=True):
        line = []
        for c in shown:
            value = " ".join(overrides) if c == "overrides" else row[c]
            if c in ("tokens_per_s", "samples_per_s") and value is not None:
                line.append(f"{value:,.0f}" if c == "tokens_per_s" else f"{value:,.1f}")
            else:
                line.append(fmt(value, digits.get(c, 4)))
        cells.append(line)
    text_columns = {"overrides", "job_id", "state"}
    print(table(shown, cells, right=[i for i, c in enumerate(shown) if c not in text_columns]))
    path = csv_path or RunDir(target.sweep_dir).summary_csv
    try:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: "" if v is None else v for k, v in row.items()})
    except OSError as err:
        raise JobsError(f"cannot write {path}: {err.strerror}") from None
    print(f"wrote {path}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- CLI


def _parser(command: str) -> Parser:
    parser = Parser(prog=f"hpctrain {command}", description=COMMANDS[command])
    if command == "summary":
        parser.add_argument("target", metavar="SWEEP_DIR")
        parser.add_argument(
            "--csv", type=Path, metavar="PATH", help="where to write the CSV (SWEEP_DIR/summary.csv)"
        )
    else:
        parser.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    return parser


def _run(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    target = resolve(args.target)
    if command == "status":
        return status(target)
    if command == "cancel":
        return cancel(target)
    return summary(target, args.csv)


COMMANDS = {
    "status": "Slurm state and training progress of a run, a sweep or a job id.",
    "cancel": "Cancel a run's Slurm job, or every member of a sweep.",
    "summary": "Final metrics of every member of a sweep, as a table and a CSV.",
}


def run(command: str, argv: list[str]) -> int:
    """``hpctrain COMMAND ARGS...`` for COMMAND one of status, cancel, summary."""
    return guarded(f"hpctrain {command}", lambda: _run(command, argv))
