"""``hpctrain status | logs | cancel | summary``: look after runs and sweeps once they are submitted.

A TARGET is a run directory (``job.json``; a local run has none and shows its progress only), a sweep
directory (``sweep.json``) or a Slurm job id (``123``, or ``123_4`` for one array member), whose run or sweep
directory is found from the job's output path while slurmctld still knows the job.

    hpctrain status TARGET                   job, Slurm state, nodes, elapsed, step / max_steps, loss, error
    hpctrain logs TARGET [-f] [-n N] [--rank R] [--member I]    the tail of logs/rank<R>.log
    hpctrain cancel TARGET                   scancel the run's job, or every member of a sweep
    hpctrain summary SWEEP_DIR [--csv PATH]  final metrics of every member, as a table and a CSV

Bad arguments are one line on stderr and exit status 2; a target that cannot be found or read, or a Slurm
query that fails, is one line on stderr and exit status 1. Runs on login nodes: no torch import here.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hpctrain.config.io import RUN_CONFIG
from hpctrain.rundir.records import (
    JOB_RECORD,
    METRICS_FILE,
    SWEEP_RECORD,
    JobRecord,
    SweepMember,
    SweepRecord,
    error_last_line,
    first_error,
    read_job,
    read_sweep,
)
from hpctrain.slurm import commands
from hpctrain.slurm.commands import JOB_ID, JobState, SlurmUnavailable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_TAIL = 20
FOLLOW_POLL_S = 0.5  # how often ``logs -f`` looks for new lines
STATE_POLL_S = 2.0  # how often ``logs -f`` asks Slurm whether the job has ended
TAIL_BYTES = 256 * 1024  # status reads only the end of metrics.jsonl


class JobsError(Exception):
    """A target that cannot be found or read: one line on stderr, exit status 1."""


class UsageError(Exception):
    """Bad arguments: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# ---------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    """What a TARGET argument names. ``run_dir`` is None for a job id whose directory was not found."""

    text: str
    run_dir: Path | None = None
    job: JobRecord | None = None  # None for a local run
    sweep: SweepRecord | None = None
    sweep_dir: Path | None = None
    job_id: str | None = None  # a bare job id, when no directory is known

    @property
    def is_sweep(self) -> bool:
        return self.sweep is not None

    @property
    def slurm_id(self) -> str | None:
        return self.job.job_id if self.job is not None else self.job_id


def resolve(text: str) -> Target:
    path = Path(text).expanduser()
    if path.is_file() and path.name in (JOB_RECORD, SWEEP_RECORD):
        path = path.parent
    if path.is_dir():
        return _resolve_dir(text, path.absolute())
    if JOB_ID.fullmatch(text):
        return _resolve_job_id(text)
    raise JobsError(f"{text}: no such run directory, sweep directory or Slurm job id")


def _resolve_dir(text: str, path: Path) -> Target:
    try:
        sweep = read_sweep(path)
        if sweep is not None:
            return Target(text, sweep=sweep, sweep_dir=path)
        job = read_job(path)
    except (ValueError, TypeError, KeyError) as err:
        raise JobsError(f"{text}: unreadable record ({err})") from None
    if job is not None:
        return Target(text, run_dir=path, job=job)
    if (path / RUN_CONFIG).is_file() or (path / METRICS_FILE).is_file():
        return Target(text, run_dir=path)  # a local run
    raise JobsError(
        f"{text}: not a run or sweep directory (no {JOB_RECORD}, {SWEEP_RECORD} or {METRICS_FILE})"
    )


def _resolve_job_id(job_id: str) -> Target:
    states = _states([job_id])
    if job_id not in states and not _array_members(job_id, states):
        raise JobsError(f"{job_id}: unknown Slurm job id")
    found = _directory_of_job(job_id)
    return found if found is not None else Target(job_id, job_id=job_id)


def _directory_of_job(job_id: str) -> Target | None:
    """The run or sweep directory of a job, from where submitit or an sbatch script writes its output."""
    try:
        fields = commands.show_job(job_id) or {}
    except RuntimeError:
        return None
    array = job_id.split("_")[0]
    seen: set[Path] = set()
    for key in ("StdOut", "Command", "WorkDir"):
        value = fields.get(key, "")
        if not value.startswith("/"):
            continue
        for parent in list(Path(value).parents)[:4]:
            if parent in seen or parent == Path("/"):
                continue
            seen.add(parent)
            try:
                job = read_job(parent)
                sweep = read_sweep(parent)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if job is not None and job.job_id == job_id:
                return Target(job_id, run_dir=parent, job=job)
            if sweep is not None:
                if sweep.array_job_id == job_id:
                    return Target(job_id, sweep=sweep, sweep_dir=parent)
                member = next((m for m in sweep.members if m.job_id == job_id), None)
                if member is not None:
                    return _member_target(job_id, member)
                if sweep.array_job_id == array:
                    return Target(job_id, sweep=sweep, sweep_dir=parent)
    return None


def _member_target(text: str, member: SweepMember) -> Target:
    run_dir = Path(member.run_dir)
    try:
        job = read_job(run_dir)
    except (ValueError, TypeError, KeyError):
        job = None
    if job is None:  # the member's job.json is missing: its id is in the sweep's record
        job = JobRecord(member.job_id, "", "", 0, 0, "")
    return Target(text, run_dir=run_dir, job=job)


def _array_members(array_id: str, states: dict[str, JobState]) -> list[JobState]:
    """The members of job array ``array_id`` among ``states`` (Slurm answers for an array id with those)."""
    return [s for job, s in states.items() if job.startswith(f"{array_id}_")]


def _state_of(job_id: str) -> tuple[JobState | None, list[JobState]]:
    """A job's state; for a job array's id, one state standing for all its members, and the members."""
    states = _states([job_id])
    if job_id in states:
        return states[job_id], []
    members = _array_members(job_id, states)
    if not members:
        return None, []
    words = [m.state for m in members]
    active = [w for w in words if w not in commands.FINAL_STATES]
    if active:
        word = "RUNNING" if "RUNNING" in active else active[0]
    else:
        word = next((w for w in words if w != "COMPLETED"), "COMPLETED")
    return JobState(job_id, word, "", "", ""), members


def _states(job_ids: list[str]) -> dict[str, JobState]:
    try:
        return commands.job_states(job_ids)
    except SlurmUnavailable as err:
        raise JobsError(str(err)) from None
    except (RuntimeError, OSError, ValueError) as err:  # a client that failed or timed out
        raise JobsError(f"cannot query Slurm: {err}") from None


# ---------------------------------------------------------------------------------------------- metrics


def read_records(path: Path, tail_bytes: int | None = None) -> list[dict[str, Any]]:
    """metrics.jsonl's records; with ``tail_bytes``, only those in the end of the file. A line being written
    (or cut by the tail) is skipped."""
    try:
        with open(path, "rb") as f:
            if tail_bytes is not None:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - tail_bytes))
            data = f.read()
    except OSError:
        return []
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def max_steps(run_dir: Path) -> int | None:
    from omegaconf import OmegaConf  # the CLI has it loaded already; a plain YAML read, no resolution

    try:
        return int(OmegaConf.load(run_dir / RUN_CONFIG).trainer.max_steps)
    except Exception:  # missing, partly written or from another version: the progress shows the step only
        return None


def _last(records: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get(key) is not None), None)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _progress(run_dir: Path, records: list[dict[str, Any]]) -> str:
    last = records[-1]["step"] if records else "-"
    total = max_steps(run_dir)
    return f"{last}/{total}" if total is not None else str(last)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = ()) -> str:
    """An aligned plain-text table (two spaces between columns; columns in ``right`` right-aligned)."""
    rows = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    right = set(right)
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def split_overrides(members: list[SweepMember]) -> tuple[list[str], list[list[str]]]:
    """The overrides every member shares, and each member's own (all of them when there is one member)."""
    if len(members) < 2:
        return [], [list(m.overrides) for m in members]
    common = [o for o in members[0].overrides if all(o in m.overrides for m in members[1:])]
    return common, [[o for o in m.overrides if o not in common] for m in members]


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
            size = f"{_plural(job.nodes, 'node')} × {_plural(job.tasks_per_node, 'task')}"
            detail = f" ({job.launcher} on {job.cluster}: {size})"
        out.append(("job", job_id + detail))
        members: list[JobState] = []
        try:
            state, members = _state_of(job_id)
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
        records = read_records(target.run_dir / METRICS_FILE, TAIL_BYTES)
        out.append(("step", _progress(target.run_dir, records)))
        last_loss = _last(records, "loss")
        out.append(("loss", _fmt(last_loss["loss"]) if last_loss else "-"))
        last_val = _last(records, "val_loss")
        if last_val is not None:
            val = f"{_fmt(last_val['val_loss'])}"
            if last_val.get("val_acc") is not None:
                val += f", val_acc {_fmt(last_val['val_acc'], 3)}"
            out.append(("val_loss", f"{val} (step {last_val['step']})"))
        failed = state is not None and state.state == "FAILED"
        if failed or (job_id is None and state is None):
            error = first_error(target.run_dir)
            if error is not None:
                rank, record = error
                host = f" on {record['host']}" if record.get("host") else ""
                out.append(("error", f"rank {rank}{host}: {error_last_line(record)}"))
                out.append(("", f"log: {target.run_dir / 'logs' / f'rank{rank}.log'}"))
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
        states = _states([m.job_id for m in sweep.members])
    except JobsError as err:
        print(f"hpctrain status: {err}", file=sys.stderr)
        states, code = {}, EXIT_FAILED
    counts: dict[str, int] = {}
    for member in sweep.members:
        word = states[member.job_id].state if member.job_id in states else "UNKNOWN"
        counts[word] = counts.get(word, 0) + 1
    tally = ", ".join(f"{n} {word}" for word, n in counts.items())
    n = _plural(len(sweep.members), "member")
    print(f"sweep {target.sweep_dir}: array job {sweep.array_job_id} on {sweep.cluster}, {n} ({tally})")
    common, own = split_overrides(sweep.members)
    if common:
        print(f"common overrides: {' '.join(common)}")
    rows = []
    for member, overrides in zip(sweep.members, own, strict=True):
        run_dir = Path(member.run_dir)
        records = read_records(run_dir / METRICS_FILE, TAIL_BYTES)
        last_loss = _last(records, "loss")
        state = states.get(member.job_id)
        rows.append(
            [
                str(member.index),
                " ".join(overrides),
                member.job_id,
                state.state if state else "UNKNOWN",
                _progress(run_dir, records),
                _fmt(last_loss["loss"]) if last_loss else "",
            ]
        )
    print(table(["#", "overrides", "job", "state", "step", "loss"], rows, right=(0, 4, 5)))
    return code


# ---------------------------------------------------------------------------------------------- logs


def _log_path(target: Target, rank: int) -> tuple[Path | None, Path | None]:
    """(rank R's log in the run directory, Slurm's output file as a fallback), either possibly unknown."""
    rank_log = target.run_dir / "logs" / f"rank{rank}.log" if target.run_dir is not None else None
    slurm_out: Path | None = None
    job = target.job
    if job is not None and job.slurm_output:
        slurm_out = Path(job.slurm_output.replace("%j", job.job_id).replace("%t", str(rank)))
    elif target.job_id is not None and rank == 0:
        try:
            fields = commands.show_job(target.job_id) or {}
        except RuntimeError:
            fields = {}
        if fields.get("StdOut", "").startswith("/"):
            slurm_out = Path(fields["StdOut"])
    return rank_log, slurm_out


def _tail(path: Path, n: int) -> tuple[str, int]:
    """The last ``n`` lines of a file, and the offset where they end (complete lines only)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        block, data = 64 * 1024, b""
        start = size
        while start > 0 and data.count(b"\n") <= n:
            start = max(0, start - block)
            f.seek(start)
            data = f.read(size - start)
    end = data.rfind(b"\n") + 1  # a line still being written is left for follow
    lines = data[:end].splitlines(keepends=True)
    return b"".join(lines[-n:] if n else []).decode("utf-8", errors="replace"), start + end


def logs(target: Target, follow: bool, n: int, rank: int) -> int:
    rank_log, slurm_out = _log_path(target, rank)
    if not follow:
        for path in (rank_log, slurm_out):
            if path is not None and path.is_file():
                if path != rank_log:
                    print(f"hpctrain logs: no {rank_log} yet: Slurm's output {path}", file=sys.stderr)
                text, _ = _tail(path, n)
                sys.stdout.write(text)
                return EXIT_OK
        raise JobsError(f"no log yet: {rank_log or slurm_out or 'Slurm does not say where the output goes'}")
    path = rank_log or slurm_out
    if path is None:
        raise JobsError(f"{target.text}: Slurm does not say where job {target.job_id} writes its output")
    return _follow(path, n, target.slurm_id, fallback=slurm_out if path == rank_log else None)


def _follow(path: Path, n: int, job_id: str | None, fallback: Path | None) -> int:
    """Print the tail of ``path`` and then its new lines until the job ends (until Ctrl-C for a local run)."""
    offset: int | None = None
    partial = b""
    next_check = 0.0
    final = False
    waiting_said = False
    while True:
        if offset is None and path.is_file():
            text, offset = _tail(path, n)
            sys.stdout.write(text)
        if offset is not None:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            offset += len(data)
            data = partial + data
            cut = data.rfind(b"\n") + 1
            sys.stdout.write(data[:cut].decode("utf-8", errors="replace"))
            partial = data[cut:]
        sys.stdout.flush()
        if final:
            break
        if job_id is not None and time.monotonic() >= next_check:
            state, _ = _state_of(job_id)
            next_check = time.monotonic() + STATE_POLL_S
            if state is None or state.final:
                final = True  # one more read: the last lines land as the job ends
                continue
            if offset is None and not waiting_said:
                print(f"hpctrain logs: waiting for {path} (job {job_id} is {state.state})", file=sys.stderr)
                waiting_said = True
        time.sleep(FOLLOW_POLL_S)
    if partial:
        sys.stdout.write(partial.decode("utf-8", errors="replace") + "\n")
    if offset is None:
        if fallback is not None and fallback.is_file():
            print(f"hpctrain logs: the job ended without {path}: Slurm's output {fallback}", file=sys.stderr)
            sys.stdout.write(_tail(fallback, n)[0])
        else:
            raise JobsError(f"the job ended without writing {path}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- cancel


def cancel(target: Target) -> int:
    if target.is_sweep:
        return _cancel_sweep(target)
    job_id = target.slurm_id
    if job_id is None:
        raise JobsError(f"{target.text} is a local run (no {JOB_RECORD}): stop it where it runs (Ctrl-C)")
    state, _ = _state_of(job_id)
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
    states = _states([m.job_id for m in sweep.members])
    active = [m for m in sweep.members if m.job_id in states and not states[m.job_id].final]
    done = len(sweep.members) - len(active)
    if not active:
        print(f"array job {sweep.array_job_id}: no member is queued or running: nothing to cancel")
        return EXIT_OK
    whole_array = all(m.job_id.split("_")[0] == sweep.array_job_id for m in sweep.members)
    _scancel([sweep.array_job_id] if whole_array else [m.job_id for m in active])
    listed = ", ".join(f"{m.job_id} {states[m.job_id].state}" for m in active)
    rest = f"; {done} already ended" if done else ""
    print(f"cancelled array job {sweep.array_job_id}: {_plural(len(active), 'member')} ({listed}){rest}")
    return EXIT_OK


def _scancel(job_ids: list[str]) -> None:
    try:
        commands.cancel(job_ids)
    except SlurmUnavailable as err:
        raise JobsError(str(err)) from None
    except (RuntimeError, OSError) as err:
        raise JobsError(f"scancel failed: {err}") from None


# ---------------------------------------------------------------------------------------------- summary


def summary_rows(sweep: SweepRecord, states: dict[str, JobState]) -> tuple[list[str], list[dict[str, Any]]]:
    """One dict per member (CSV-ready values; None for what is unknown), and the columns in use."""
    rows = []
    for member in sweep.members:
        records = read_records(Path(member.run_dir) / METRICS_FILE)
        vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
        accs = [r["val_acc"] for r in records if r.get("val_acc") is not None]
        last_loss = _last(records, "loss")
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


def summary(target: Target, csv_path: Path | None) -> int:
    sweep = target.sweep
    if sweep is None or target.sweep_dir is None:
        raise JobsError(f"{target.text}: not a sweep directory (no {SWEEP_RECORD})")
    try:
        states = _states([m.job_id for m in sweep.members])
    except JobsError as err:  # the metrics are still worth showing (e.g. a copied sweep dir, no Slurm here)
        print(f"hpctrain summary: states unknown: {err}", file=sys.stderr)
        states = {}
    columns, rows = summary_rows(sweep, states)
    common, own = split_overrides(sweep.members)
    n = _plural(len(sweep.members), "member")
    print(f"sweep {target.sweep_dir}: array job {sweep.array_job_id} on {sweep.cluster}, {n}")
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
                line.append(_fmt(value, digits.get(c, 4)))
        cells.append(line)
    text_columns = {"overrides", "job_id", "state"}
    print(table(shown, cells, right=[i for i, c in enumerate(shown) if c not in text_columns]))
    path = csv_path or target.sweep_dir / "summary.csv"
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


def _parser(command: str) -> _Parser:
    parser = _Parser(prog=f"hpctrain {command}", description=COMMANDS[command])
    if command == "summary":
        parser.add_argument("target", metavar="SWEEP_DIR")
        parser.add_argument(
            "--csv", type=Path, metavar="PATH", help="where to write the CSV (SWEEP_DIR/summary.csv)"
        )
    else:
        parser.add_argument(
            "target", metavar="TARGET", help="a run directory, a sweep directory or a Slurm job id"
        )
    if command == "logs":
        parser.add_argument(
            "-f", "--follow", action="store_true", help="follow until the job ends (or Ctrl-C)"
        )
        parser.add_argument("-n", "--lines", type=int, default=DEFAULT_TAIL, metavar="N", help="last N lines")
        parser.add_argument("--rank", type=int, default=0, metavar="R", help="whose log (default 0)")
        parser.add_argument("--member", type=int, metavar="I", help="which member of a sweep")
    return parser


def _run(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    if command == "logs":
        if args.lines < 0:
            raise UsageError(f"-n must be 0 or more, not {args.lines}")
        if args.rank < 0:
            raise UsageError(f"--rank must be 0 or more, not {args.rank}")
    target = resolve(args.target)
    if command == "status":
        return status(target)
    if command == "cancel":
        return cancel(target)
    if command == "summary":
        return summary(target, args.csv)
    if target.is_sweep:
        assert target.sweep is not None
        members = {m.index: m for m in target.sweep.members}
        if args.member is None or args.member not in members:
            choice = f"0..{len(members) - 1}" if members else "none"
            raise UsageError(f"{args.target} is a sweep: choose a member with --member I ({choice})")
        target = _member_target(args.target, members[args.member])
    elif args.member is not None:
        raise UsageError(f"--member is for a sweep directory; {args.target} is a single run")
    return logs(target, args.follow, args.lines, args.rank)


COMMANDS = {
    "status": "Slurm state and training progress of a run, a sweep or a job id.",
    "logs": "The tail of a rank's log; -f follows it until the job ends.",
    "cancel": "Cancel a run's Slurm job, or every member of a sweep.",
    "summary": "Final metrics of every member of a sweep, as a table and a CSV.",
}


def main(argv: list[str]) -> int:
    """``argv`` is ``[COMMAND, *ARGS]`` with COMMAND one of status, logs, cancel, summary."""
    if not argv or argv[0] not in COMMANDS:
        print(f"hpctrain: expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    command = argv[0]
    try:
        return _run(command, argv[1:])
    except UsageError as err:
        print(f"hpctrain {command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except JobsError as err:
        print(f"hpctrain {command}: {err}", file=sys.stderr)
        return EXIT_FAILED
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
