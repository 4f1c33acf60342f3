"""``hpctrain report RUN_DIR|SWEEP_DIR [--out DIR]``: parse, resolve the target, print what was drawn.

Exit status: 0 written; 1 nothing to plot or a file that cannot be written; 2 bad arguments or a directory
that is neither a run nor a sweep. A run or sweep submitted from here over ``cluster.ssh`` is drawn on the
cluster, where its metrics are, and the pictures are copied back into ``--out`` here. No torch import here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hpctrain.cli.common import EXIT_OK, JobsError, Parser, UsageError, guarded, table
from hpctrain.jobs.targets import Target, forward, remote_target
from hpctrain.observe.report import ReportError, report_sweep, run_pictures, unit_of
from hpctrain.observe.results import (
    Member,
    ScalingPoint,
    error_text,
    is_run_dir,
    last_value,
    steady_throughput,
    throughput_key,
)
from hpctrain.rundir import JOB_RECORD, METRICS_FILE, MULTIRUN_RECORD, RUN_CONFIG, SWEEP_RECORD, RunDir
from hpctrain.rundir.records import first_error
from hpctrain.slurm.remote import RemoteError


def _member_table(members: list[Member]) -> str:
    key = throughput_key([r for m in members for r in m.records])
    unit = unit_of(key)
    rows = []
    for m in members:
        loss, val = last_value(m.records, "loss"), last_value(m.records, "val_loss")
        total = RunDir(m.run_dir).max_steps()
        step = str(m.records[-1]["step"]) if m.records else "-"
        rate = steady_throughput(m.records, key) if key else None
        note = f"skipped: {m.skipped}" if m.skipped else (m.state or "")
        rows.append(
            [
                str(m.index),
                m.label,
                str(m.world_size or "?"),
                f"{step}/{total}" if total is not None else step,
                "" if loss is None else f"{loss:.4f}",
                "" if val is None else f"{val:.4f}",
                "" if rate is None else f"{rate:,.0f}",
                note,
            ]
        )
    headers = ["#", "overrides", "ranks", "step", "loss", "val_loss", unit, ""]
    return table(headers, rows, right=(0, 2, 3, 4, 5, 6))


def _scaling_table(points: list[ScalingPoint], unit: str) -> str:
    rows = [
        [
            str(p.ranks),
            f"{p.throughput:,.0f}",
            f"{p.speedup:.2f}",
            f"{p.ideal:g}",
            f"{100 * p.efficiency:.0f}%",
        ]
        for p in points
    ]
    return table(["ranks", unit, "speedup", "ideal", "efficiency"], rows, right=range(5))


def _resolve(text: str) -> tuple[str, Path]:
    path = Path(text).expanduser()
    if path.is_file() and path.name in (SWEEP_RECORD, MULTIRUN_RECORD, JOB_RECORD, METRICS_FILE, RUN_CONFIG):
        path = path.parent
    if not path.is_dir():
        raise UsageError(f"{text}: no such directory")
    if RunDir(path).sweep.is_file() or RunDir(path).multirun.is_file():
        return "sweep", path
    if is_run_dir(path):
        return "run", path
    if any(p.name.isdigit() and is_run_dir(p) for p in path.iterdir() if p.is_dir()):
        # A sweep run here by a sweeper that writes no multirun.yaml (Optuna's), before sweep.json was
        # written for sweeps run here: its numbered member runs, as status and summary read it.
        return "sweep", path
    raise UsageError(
        f"{text}: not a run or sweep directory (no {RUN_CONFIG}, {METRICS_FILE}, {JOB_RECORD}, "
        f"{SWEEP_RECORD} or {MULTIRUN_RECORD})"
    )


def _run(argv: Sequence[str]) -> int:
    parser = Parser(prog="hpctrain report", description="PNG pictures of a run's or a sweep's metrics.")
    parser.add_argument("target", metavar="RUN_DIR|SWEEP_DIR")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where to write the pictures (TARGET/report)")
    args = parser.parse_args(list(argv))
    remote = remote_target(args.target)
    if remote is not None:
        return _report_remote(remote, args.out or RunDir(Path(args.target)).report)
    kind, path = _resolve(args.target)
    if kind == "run":
        pictures = run_pictures(path, args.out)
        error = first_error(path)
        if error is not None:
            print(f"run {path} failed: {error_text(error)} (its metrics up to then are drawn)")
        for picture in pictures:
            print(f"wrote {picture.path}")
        return EXIT_OK
    report = report_sweep(path, args.out)
    n = len(report.members)
    print(f"sweep {path}: {n} member{'s' * (n != 1)}")
    if report.common:
        print(f"common overrides: {' '.join(report.common)}")
    print(_member_table(report.members))
    if report.scaling:
        key = throughput_key([r for m in report.members if m.skipped is None for r in m.records])
        print(_scaling_table(report.scaling, unit_of(key)))
    if not report.pictures:
        raise ReportError("nothing to plot: no member of the sweep has metrics")
    for picture in report.pictures:
        print(f"wrote {picture.path}")
    return EXIT_OK


def _report_remote(target: Target, out: Path) -> int:
    """Draw on the cluster (the pictures go to the run's report folder there), then copy them into ``out``."""
    assert target.remote is not None and target.remote_dir is not None
    there = str(RunDir(Path(target.remote_dir)).report)
    code = forward(target, "report", [f"--out={there}"])
    if code != 0:
        return code
    try:
        target.remote.fetch(there, out)
    except RemoteError as err:
        raise JobsError(str(err)) from None
    print(f"copied the pictures to {out}")
    return EXIT_OK


def run(name: str, argv: list[str]) -> int:
    """``hpctrain report TARGET [--out DIR]`` (``argv`` without the word ``report``)."""

    def report() -> int:
        try:
            return _run(argv)
        except ReportError as err:
            raise JobsError(str(err)) from None

    return guarded("hpctrain report", report)
