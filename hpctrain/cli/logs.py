"""``hpctrain logs TARGET [-f] [-n N] [--rank R] [--member I]``: the tail of a rank's log, or follow it until
the job ends. TARGET is resolved by :mod:`hpctrain.jobs.targets`. No torch import here."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hpctrain.cli.common import EXIT_OK, JobsError, Parser, UsageError, guarded
from hpctrain.jobs.targets import TARGET_HELP, Target, member_target, resolve, state_of
from hpctrain.rundir import RunDir
from hpctrain.slurm import commands

DEFAULT_TAIL = 20
FOLLOW_POLL_S = 0.5  # how often ``logs -f`` looks for new lines
STATE_POLL_S = 2.0  # how often ``logs -f`` asks Slurm whether the job has ended

# ---------------------------------------------------------------------------------------------- logs


def _log_path(target: Target, rank: int) -> tuple[Path | None, Path | None]:
    """(rank R's log in the run directory, Slurm's output file as a fallback), either possibly unknown."""
    rank_log = RunDir(target.run_dir).log(rank) if target.run_dir is not None else None
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
            state, _ = state_of(job_id)
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


# ---------------------------------------------------------------------------------------------- CLI

DESCRIPTION = "The tail of a rank's log; -f follows it until the job ends."


def _parser() -> Parser:
    parser = Parser(prog="hpctrain logs", description=DESCRIPTION)
    parser.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    parser.add_argument("-f", "--follow", action="store_true", help="follow until the job ends (or Ctrl-C)")
    parser.add_argument("-n", "--lines", type=int, default=DEFAULT_TAIL, metavar="N", help="last N lines")
    parser.add_argument("--rank", type=int, default=0, metavar="R", help="whose log (default 0)")
    parser.add_argument("--member", type=int, metavar="I", help="which member of a sweep")
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.lines < 0:
        raise UsageError(f"-n must be 0 or more, not {args.lines}")
    if args.rank < 0:
        raise UsageError(f"--rank must be 0 or more, not {args.rank}")
    target = resolve(args.target)
    if target.is_sweep:
        assert target.sweep is not None
        members = {m.index: m for m in target.sweep.members}
        if args.member is None or args.member not in members:
            choice = f"0..{len(members) - 1}" if members else "none"
            raise UsageError(f"{args.target} is a sweep: choose a member with --member I ({choice})")
        target = member_target(args.target, members[args.member])
    elif args.member is not None:
        raise UsageError(f"--member is for a sweep directory; {args.target} is a single run")
    return logs(target, args.follow, args.lines, args.rank)


def run(name: str, argv: list[str]) -> int:
    """``hpctrain logs TARGET [-f] [-n N] [--rank R] [--member I]`` (``argv`` without the word ``logs``)."""
    return guarded("hpctrain logs", lambda: _run(argv))
