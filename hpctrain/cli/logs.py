"""``hpctrain logs TARGET [-f] [-n N] [--rank R] [--member I]``: the tail of a rank's log, or follow it until
the job ends. TARGET is resolved by :mod:`hpctrain.jobs.targets`. No torch import here."""

from __future__ import annotations

import sys

from hpctrain.cli.common import EXIT_OK, Parser, UsageError, guarded
from hpctrain.jobs.logs import logs
from hpctrain.jobs.targets import TARGET_HELP, forward, member_target, resolve

DEFAULT_TAIL = 20

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
    if target.remote is not None:  # submitted from here over cluster.ssh: the run is on the cluster
        options = ["-n", str(args.lines), "--rank", str(args.rank), *(["-f"] if args.follow else [])]
        return forward(target, "logs", options)
    if target.is_sweep:
        assert target.sweep is not None
        members = {m.index: m for m in target.sweep.members}
        if args.member is None or args.member not in members:
            choice = f"0..{len(members) - 1}" if members else "none"
            raise UsageError(f"{args.target} is a sweep: choose a member with --member I ({choice})")
        target = member_target(args.target, members[args.member])
    elif args.member is not None:
        raise UsageError(f"--member is for a sweep directory; {args.target} is a single run")
    if target.run_dir is not None:  # a rank the run does not have would otherwise read "no log yet"
        from hpctrain.observe.results import world_size

        world = world_size(target.run_dir)
        if world is not None and args.rank >= world:
            ranks = "0" if world == 1 else f"0-{world - 1}"
            raise UsageError(f"--rank={args.rank}: {args.target} has {world} rank(s) (valid: {ranks})")
    for stream, text in logs(target, args.follow, args.lines, args.rank):
        if stream == "note":
            print(f"hpctrain logs: {text}", file=sys.stderr)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    return EXIT_OK


def run(name: str, argv: list[str]) -> int:
    """``hpctrain logs TARGET [-f] [-n N] [--rank R] [--member I]`` (``argv`` without the word ``logs``)."""
    return guarded("hpctrain logs", lambda: _run(argv))
