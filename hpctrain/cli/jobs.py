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
    EXIT_OK,
    JobsError,
    Parser,
    UsageError,
    fmt,
    guarded,
    plural,
    table,
)
from hpctrain.jobs.status import cancel, status, where
from hpctrain.jobs.summary import summary_rows, sweep_states
from hpctrain.jobs.targets import TARGET_HELP, Target, forward, resolve
from hpctrain.rundir import JOB_RECORD, SWEEP_RECORD, RunDir
from hpctrain.rundir.records import split_overrides

# ---------------------------------------------------------------------------------------------- summary


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
    print(f"sweep {target.sweep_dir}: {where(sweep)}, {n}")
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
    elif command == "status":
        parser.add_argument(
            "target", metavar="TARGET", nargs="?", help=f"{TARGET_HELP} (default: the latest run)"
        )
    else:
        parser.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    return parser


def _run(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    target = resolve(args.target)
    if target.remote is not None:  # submitted from here over cluster.ssh: the run is on the cluster
        if command == "summary" and args.csv is not None:
            raise UsageError(
                "--csv: the run is on the cluster (cluster.ssh); its summary.csv is written there"
            )
        return forward(target, command, [])
    if command == "status":
        report = status(target)
        for problem in report.problems:
            print(f"hpctrain status: {problem}", file=sys.stderr)
        for line in report.lines:
            print(line)
        return report.code
    if command == "cancel":
        if not target.is_sweep and target.slurm_id is None:  # no job to cancel: stop is the command for it
            text = target.text
            raise UsageError(f"{text} is a local run (no {JOB_RECORD}): stop it with hpctrain stop {text}")
        print(cancel(target))
        return EXIT_OK
    return summary(target, args.csv)


COMMANDS = {
    "status": "Slurm state and training progress of a run, a sweep or a job id.",
    "cancel": "Cancel a run's Slurm job, or every member of a sweep.",
    "summary": "Final metrics of every member of a sweep, as a table and a CSV.",
}


def run(command: str, argv: list[str]) -> int:
    """``hpctrain COMMAND ARGS...`` for COMMAND one of status, cancel, summary."""
    return guarded(f"hpctrain {command}", lambda: _run(command, argv))
