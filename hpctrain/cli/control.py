"""``hpctrain save RUN_DIR`` and ``hpctrain stop RUN_DIR``: a checkpoint now, or a checkpoint and the end of
the run without a requeue (:mod:`hpctrain.jobs.control`); ``hpctrain stacks RUN_DIR``: every rank's Python
stacks, grouped (:mod:`hpctrain.jobs.stacks`). A run submitted from here over ``cluster.ssh`` is
asked on the cluster, where its ranks read the request (:func:`hpctrain.jobs.targets.forward`). No torch
import here."""

from __future__ import annotations

from pathlib import Path

from hpctrain.cli.common import EXIT_OK, Parser, UsageError, guarded
from hpctrain.jobs.control import request
from hpctrain.jobs.stacks import report as stacks_report
from hpctrain.jobs.targets import forward, remote_target

DEFAULT_WAIT_S = 120.0
STACKS_WAIT_S = 5.0  # every live rank answers within a quarter of a second


def _parser(prog: str, description: str, wait_s: float, waits_for: str) -> Parser:
    """RUN_DIR and --wait S, alike for save, stop and stacks."""
    parser = Parser(prog=prog, description=description)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory of a running run")
    parser.add_argument(
        "--wait",
        type=float,
        default=wait_s,
        metavar="S",
        help=f"seconds to wait for {waits_for} (default {wait_s:g})",
    )
    return parser


def _stacks(argv: list[str]) -> int:
    description = "Every rank's Python stacks, grouped, in seconds."
    args = _parser("hpctrain stacks", description, STACKS_WAIT_S, "every rank").parse_args(argv)
    if not 0 <= args.wait <= 3600:
        raise UsageError(f"--wait must be between 0 and 3600 seconds, not {args.wait}")
    target = remote_target(args.run_dir)
    if target is not None:  # submitted from here over cluster.ssh: the ranks answer on the cluster
        return forward(target, "stacks", [f"--wait={args.wait!r}"])
    lines, _ = stacks_report(Path(args.run_dir), args.wait)
    print("\n".join(lines))
    return EXIT_OK


def _run(name: str, argv: list[str]) -> int:
    if name == "stacks":
        return _stacks(argv)
    what = "a checkpoint at the next step boundary" if name == "save" else "a checkpoint, then the end"
    parser = _parser(f"hpctrain {name}", f"Ask a running run for {what}.", DEFAULT_WAIT_S, "the answer")
    args = parser.parse_args(argv)
    if not args.wait >= 0:
        raise UsageError(f"--wait must be 0 or more seconds, not {args.wait}")
    target = remote_target(args.run_dir)
    if target is not None:  # submitted from here over cluster.ssh: the run and its ranks are on the cluster
        return forward(target, name, [f"--wait={args.wait!r}"])
    print(f"hpctrain {name}: {request(Path(args.run_dir), name, args.wait)}")
    return EXIT_OK


def run(name: str, argv: list[str]) -> int:
    """``hpctrain save|stop|stacks RUN_DIR [--wait S]`` (``argv`` without the subcommand)."""
    return guarded(f"hpctrain {name}", lambda: _run(name, argv))
