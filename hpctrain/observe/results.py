"""What a run's or a sweep's metrics say: the records, final values, steady throughput, the members of a
sweep (from sweep.json or a local multirun) with their states and errors, and scaling points. No torch, no
matplotlib: :mod:`hpctrain.observe.report` draws from these.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.io import load_run_config
from hpctrain.rundir import SWEEP_RECORD, RunDir
from hpctrain.rundir.records import (
    SweepMember,
    error_last_line,
    first_error,
    read_job,
    read_sweep,
    split_overrides,
)

if TYPE_CHECKING:
    pass

THROUGHPUT_KEYS = ("tokens_per_s", "samples_per_s")
# The cluster a sweep run here records in its sweep.json (hpctrain.jobs.targets.LOCAL; jobs is a layer above).
LOCAL = "local"


class ReportError(Exception):
    """Nothing to plot, or a file that cannot be read or written: one line on stderr, exit status 1."""


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Series:
    """One line or one set of bars as drawn, read back from the figure: values in the units of its axis
    (MFU and efficiency in percent); ``x`` holds steps, ranks, or member labels for bars."""

    panel: str  # the axes it is drawn in: "loss", "val_loss", "throughput", "mfu", "speedup", ...
    label: str
    x: tuple[float | str, ...]
    y: tuple[float, ...]
    color: str  # "#rrggbb"


@dataclass
class Picture:
    path: Path
    series: list[Series]

    def get(self, label: str, panel: str | None = None) -> Series:
        found = [s for s in self.series if s.label == label and (panel is None or s.panel == panel)]
        if len(found) != 1:
            raise KeyError(f"{self.path.name}: {len(found)} series labelled {label!r} in panel {panel!r}")
        return found[0]


@dataclass
class Member:
    """One run of a sweep, and whether it is plotted (``skipped`` says why not)."""

    index: int
    label: str  # its own overrides (those not every member shares)
    run_dir: Path
    records: list[dict[str, Any]]
    world_size: int | None
    state: str | None = None  # Slurm's word, when Slurm could be asked
    skipped: str | None = None


@dataclass
class ScalingPoint:
    """Throughput at one world size: the mean over the members of that size, relative to the smallest."""

    ranks: int
    throughput: float
    speedup: float  # throughput / throughput at the smallest world size
    ideal: float  # ranks / smallest world size
    efficiency: float  # speedup / ideal: per-rank throughput against the smallest size's
    members: list[int] = field(default_factory=list)


@dataclass
class SweepReport:
    members: list[Member]
    common: list[str]
    scaling: list[ScalingPoint]
    pictures: list[Picture]


# ---------------------------------------------------------------------------------------------- reading


def values(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records that hold ``key``."""
    kept = [r for r in records if r.get(key) is not None]
    return [float(r["step"]) for r in kept], [float(r[key]) for r in kept]


def last_value(records: list[dict[str, Any]], key: str) -> float | None:
    return next((float(r[key]) for r in reversed(records) if r.get(key) is not None), None)


def throughput_key(records: list[dict[str, Any]]) -> str | None:
    """tokens_per_s for language models, samples_per_s for the others (whichever the records hold)."""
    return next((k for k in THROUGHPUT_KEYS if any(r.get(k) is not None for r in records)), None)


def steady_throughput(records: list[dict[str, Any]], key: str) -> float | None:
    """The median throughput over logged windows after the first: the first window holds the warm-up steps
    (allocations, first collectives, compilation), many times slower than the rest on small models."""
    _, ys = values(records, key)
    ys = [y for y in ys if math.isfinite(y)]
    if len(ys) > 2:
        ys = ys[1:]
    return statistics.median(ys) if ys else None


def world_size(run_dir: Path) -> int | None:
    """The number of ranks a run was configured with (config.yaml), else the size its job.json records."""
    from hpctrain.config.shape import run_shape

    try:
        return run_shape(load_run_config(RunDir(run_dir).config)).world_size
    except Exception:  # missing, partly written or from another version: job.json may still say
        pass
    try:
        job = read_job(run_dir)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return job.ranks if job is not None and job.ranks else None


def is_run_dir(path: Path) -> bool:
    return RunDir(path).is_run()


def _local_members(sweep_dir: Path) -> list[SweepMember]:
    """A local multirun's members: its subdirectories that hold a run, in Hydra's job order (numeric names
    when ``hydra.sweep.subdir`` is left at its default, the job number)."""

    dirs = [p for p in sweep_dir.iterdir() if p.is_dir() and is_run_dir(p)]
    dirs.sort(key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))
    members = []
    for position, path in enumerate(dirs):
        # Written by Hydra before the run starts; without it the member is still a run.
        overrides = RunDir(path).read_hydra_overrides() or []
        index = int(path.name) if path.name.isdigit() else position
        members.append(SweepMember(index, overrides, str(path), ""))
    return members


def _slurm_states(members: list[SweepMember]) -> dict[str, str]:
    """Each member's Slurm state word; empty (with a note) where Slurm cannot be asked, e.g. a sweep
    directory copied off the cluster: then failures are judged from the ranks' error records alone."""
    from hpctrain.slurm.commands import SlurmUnavailable, job_states

    ids = [m.job_id for m in members if m.job_id]
    if not ids:
        return {}
    try:
        return {job: state.state for job, state in job_states(ids).items()}
    except (SlurmUnavailable, RuntimeError, OSError, ValueError) as err:
        print(
            f"hpctrain report: Slurm states unknown ({err}): judged from the run directories", file=sys.stderr
        )
        return {}


def load_sweep(sweep_dir: Path, ask_slurm: bool = True) -> tuple[list[str], list[Member]]:
    """The overrides every member shares, and the members with their metrics and why any is not plotted."""
    from hpctrain.slurm.commands import FINAL_STATES

    sweep_dir = sweep_dir.absolute()
    try:
        record = read_sweep(sweep_dir)
    except (ValueError, TypeError, KeyError) as err:
        raise ReportError(f"{sweep_dir}: unreadable {SWEEP_RECORD} ({err})") from None
    swept = record.members if record is not None else _local_members(sweep_dir)
    # A sweep run here has no Slurm job to ask (its sweep.json says "local"): judged from its run directories.
    slurm = record is not None and record.cluster != LOCAL
    if record is not None and not slurm:
        # Its folders are Hydra's own record of it: one its sweep.json does not list (a member started by a
        # version that wrote none, or put there by hand) is a member too.
        listed = {Path(m.run_dir).name for m in swept}
        swept = [*swept, *(m for m in _local_members(sweep_dir) if Path(m.run_dir).name not in listed)]
    states = _slurm_states(swept) if slurm and ask_slurm else {}
    common, own = split_overrides(swept)
    members = []
    for sweep_member, overrides in zip(swept, own, strict=True):
        run_dir = Path(sweep_member.run_dir)
        beside = sweep_dir / run_dir.name
        if beside.is_dir():
            # sweep.json's paths are absolute; members are made inside the sweep directory, so the one beside
            # it is the right one also when the sweep directory was copied or moved.
            run_dir = beside
        records = RunDir(run_dir).read_metrics()
        member = Member(
            index=sweep_member.index,
            label=" ".join(overrides) or f"#{sweep_member.index}",
            run_dir=run_dir,
            records=records,
            world_size=world_size(run_dir),
            state=states.get(sweep_member.job_id),
        )
        error = first_error(run_dir) if run_dir.is_dir() else None
        if member.state is not None and member.state in FINAL_STATES and member.state != "COMPLETED":
            member.skipped = member.state
            if error is not None:
                member.skipped += f": {error_text(error)}"
        elif error is not None and member.state is None:
            # Only without Slurm's word: a rank's error record outlives a requeue until the next start clears
            # it, so while Slurm says the job is pending or running again, the record is not the final word.
            member.skipped = f"failed: {error_text(error)}"
        elif not any(r.get("loss") is not None for r in records):
            member.skipped = "no metrics" + (f" ({member.state})" if member.state else "")
        members.append(member)
    return common, members


def error_text(error: tuple[int, dict[str, Any]]) -> str:
    rank, record = error
    host = f" on {record['host']}" if record.get("host") else ""
    return f"rank {rank}{host}: {error_last_line(record)}"


def scaling_points(members: list[Member]) -> list[ScalingPoint]:
    """Speedup and parallel efficiency by world size, when the plotted members span two or more sizes (a
    scaling sweep); empty otherwise. Members of one size (e.g. seeds) are averaged."""
    plotted = [m for m in members if m.skipped is None and m.world_size]
    key = throughput_key([r for m in plotted for r in m.records])
    if key is None:
        return []
    by_size: dict[int, list[tuple[int, float]]] = {}
    for member in plotted:
        rate = steady_throughput(member.records, key)
        if rate is not None and rate > 0 and member.world_size is not None:
            by_size.setdefault(member.world_size, []).append((member.index, rate))
    if len(by_size) < 2:
        return []
    sizes = sorted(by_size)
    base_size = sizes[0]
    base = statistics.fmean(rate for _, rate in by_size[base_size])
    points = []
    for size in sizes:
        rate = statistics.fmean(r for _, r in by_size[size])
        speedup, ideal = rate / base, size / base_size
        points.append(
            ScalingPoint(size, rate, speedup, ideal, speedup / ideal, [i for i, _ in by_size[size]])
        )
    return points


# ---------------------------------------------------------------------------------------------- drawing
