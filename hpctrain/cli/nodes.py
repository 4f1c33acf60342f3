"""``hpctrain nodes [--file PATH] [--ttl-h H] [--forget NODE]``: the project's record of nodes that failed its
runs (:mod:`hpctrain.slurm.badnodes`), the evidence against each, and whether its next jobs leave it out;
``--forget NODE`` takes one out of the record. No torch, no Slurm client: the record is a file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpctrain.cli.common import EXIT_FAILED, EXIT_OK, Parser, UsageError, guarded, plural, table
from hpctrain.config.schema import ClusterConfig
from hpctrain.slurm import badnodes


def _parser() -> Parser:
    parser = Parser(
        prog="hpctrain nodes",
        description="The project's record of nodes that failed its runs, which its next jobs leave out.",
    )
    parser.add_argument(
        "--file",
        default=badnodes.DEFAULT_FILE,
        metavar="PATH",
        help=f"the record (cluster.bad_node_file; default {badnodes.DEFAULT_FILE} in this directory)",
    )
    parser.add_argument(
        "--ttl-h",
        type=float,
        default=ClusterConfig.bad_node_ttl_h,
        metavar="H",
        help=f"cluster.bad_node_ttl_h of the runs (default {ClusterConfig.bad_node_ttl_h:g})",
    )
    parser.add_argument(
        "--forget", metavar="NODE", help="take NODE out of the record: jobs may land on it again"
    )
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.file or any(ord(ch) < 32 for ch in args.file):
        raise UsageError(f"--file must be a file path, not {args.file!r}")
    if not args.ttl_h >= 0:
        raise UsageError(f"--ttl-h must be 0 or more hours, not {args.ttl_h}")
    path = Path(args.file).expanduser()
    try:
        if args.forget is not None:
            return _forget(path, args.forget)
        record = badnodes.read(path)
    except badnodes.RecordError as err:
        print(f"hpctrain nodes: {err}", file=sys.stderr)
        return EXIT_FAILED
    if not record:
        print(f"No node is recorded in {path}.")
        return EXIT_OK
    now = time.time()
    fresh = badnodes.live(record, args.ttl_h, now)
    rows = []
    for node in sorted(record, key=lambda n: -record[n][-1].time):
        e = record[node][-1]
        rows.append(
            [
                node,
                "left out" if node in fresh else "expired",
                e.kind,
                f"{e.age_h(now):.1f} h ago",
                plural(len(record[node]), "time"),
                f"{e.run} (job {e.job or '-'}): {e.why[:120]}",
            ]
        )
    print(table(["node", "next jobs", "newest", "when", "failed", "run and why"], rows))
    print(
        f"{plural(len(fresh), 'node')} left out by the next jobs of runs with cluster.bad_node_file={path} "
        f"(evidence younger than {args.ttl_h:g} h; at most half a partition). "
        "hpctrain nodes --forget NODE takes one out."
    )
    return EXIT_OK


def _forget(path: Path, node: str) -> int:
    if not badnodes.NODE_NAME.match(node):
        raise UsageError(f"--forget takes a node's host name, not {node[:40]!r}")
    try:
        gone = badnodes.forget(path, node)
    except OSError as err:
        print(
            f"hpctrain nodes: the node record {path} cannot be written: {err.strerror or err}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(f"Forgot {node} ({plural(len(gone), 'piece')} of evidence): the next jobs may land on it again.")
    return EXIT_OK


def run(name: str, argv: list[str]) -> int:
    """``hpctrain nodes [--file PATH] [--ttl-h H] [--forget NODE]``."""
    return guarded("hpctrain nodes", lambda: _run(argv))
