"""The project's record of nodes that failed its runs, so that its next runs and sweeps leave them out.

A run that excludes a node (a failed health check, a hang that came back on it, an I/O or device fault, a
node lost from the job) writes one piece of evidence into the record: when, what kind, why in words, which
run and job. A later submission of the same project adds every node with evidence younger than
``cluster.bad_node_ttl_h`` to the job's ``--exclude`` (:mod:`hpctrain.launch.avoid`, which also keeps a
partition from being excluded whole). ``hpctrain nodes`` lists the record and ``--forget NODE`` takes a
node out of it.

The record is one JSON file the user can read and edit (``cluster.bad_node_file``, by default
``.hpctrain/bad_nodes.json`` in the submit directory; an absolute path on a shared file system serves a
team)::

    {"hpctrain_bad_nodes": 1,
     "nodes": {"node2": [{"time": 1796630400.0, "kind": "unhealthy", "why": "health check: ...",
                          "run": "/home/me/proj/outputs/gpt", "job": "4242"}]}}

Jobs of a sweep may write at once: every change is a read, modify and atomic replace under an exclusive
``flock`` of a lock file beside it. A record that cannot be read is never overwritten: :class:`RecordError`
names it, and the caller says what it does without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_KEY = "hpctrain_bad_nodes"
VERSION = 1
DEFAULT_FILE = ".hpctrain/bad_nodes.json"
RECORD_ENV = "HPCTRAIN_NODE_RECORD"  # a job's record, absolute: exported by the job script (launch.jobscript)
KEEP_PER_NODE = 20  # the newest pieces of evidence per node; older ones add nothing to a decision
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a Slurm host name: no list, no range


class RecordError(Exception):
    """The record cannot be used (unreadable, not JSON, another format or version): ``str()`` is one line
    naming the file."""


@dataclass(frozen=True)
class Evidence:
    time: float  # seconds since the epoch
    kind: str  # the fault policy's word: unhealthy, hang, io, lost node, ...
    why: str  # the fault in words, as the run recorded it
    run: str  # the run directory
    job: str  # the Slurm job id

    def age_h(self, now: float) -> float:
        return max(0.0, now - self.time) / 3600


def read(path: Path) -> dict[str, list[Evidence]]:
    """Every node's evidence, oldest first; empty when there is no record yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"the node record {path} cannot be read: {err}") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise RecordError(f"the node record {path} is not JSON ({err})") from None
    if not isinstance(data, dict) or FORMAT_KEY not in data:
        raise RecordError(f"{path} is not an hpctrain node record (no {FORMAT_KEY!r} key)")
    if data[FORMAT_KEY] != VERSION:
        raise RecordError(
            f"the node record {path} is version {data[FORMAT_KEY]!r}; this hpctrain reads version {VERSION}"
        )
    nodes = data.get("nodes")
    if not isinstance(nodes, dict):
        raise RecordError(f"the node record {path} has no 'nodes' object")
    record: dict[str, list[Evidence]] = {}
    for node, items in nodes.items():
        if not NODE_NAME.match(str(node)) or not isinstance(items, list):
            raise RecordError(f"the node record {path}: {str(node)[:40]!r} is not a node name with a list")
        try:
            evidence = [_evidence(item) for item in items]
        except (TypeError, KeyError, ValueError) as err:
            raise RecordError(
                f"the node record {path}: an entry of {node} is not time, kind, why, run, job ({err})"
            ) from None
        record[node] = sorted(evidence, key=lambda e: e.time)
    return record


def _evidence(item: dict[str, object]) -> Evidence:
    t = item["time"]
    if not isinstance(t, (int, float)):
        raise ValueError("a time in seconds")
    return Evidence(float(t), str(item["kind"]), str(item["why"]), str(item["run"]), str(item["job"]))


def remember(
    path: Path, node: str, kind: str, why: str, run: str, job: str, now: float | None = None
) -> None:
    """Add one piece of evidence against ``node``. Raises OSError or :class:`RecordError` (a record that
    cannot be read is left as it is)."""
    if not NODE_NAME.match(node):
        raise RecordError(f"{node[:40]!r} is not a node name")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        record = read(path)
        items = record.setdefault(node, [])
        items.append(Evidence(time.time() if now is None else now, kind, why.strip()[:500], run, job))
        record[node] = items[-KEEP_PER_NODE:]
        _write(path, record)


def forget(path: Path, node: str) -> list[Evidence]:
    """Take ``node`` out of the record; its evidence. Raises :class:`RecordError` when it is not there."""
    if node not in read(path):  # before the lock: a missing record's folder is not made for nothing
        known = ", ".join(sorted(read(path))) or "none"
        raise RecordError(f"{node!r} is not in the node record {path} (recorded: {known})")
    with _locked(path):
        record = read(path)
        if node not in record:  # forgotten meanwhile
            known = ", ".join(sorted(record)) or "none"
            raise RecordError(f"{node!r} is not in the node record {path} (recorded: {known})")
        gone = record.pop(node)
        _write(path, record)
    return gone


def live(record: dict[str, list[Evidence]], ttl_h: float, now: float) -> dict[str, Evidence]:
    """The nodes whose newest evidence is younger than ``ttl_h`` hours, with that evidence, newest first."""
    newest = {node: items[-1] for node, items in record.items() if items}
    fresh = {node: e for node, e in newest.items() if e.age_h(now) < ttl_h}
    return dict(sorted(fresh.items(), key=lambda item: -item[1].time))


def _write(path: Path, record: dict[str, list[Evidence]]) -> None:
    data = {
        FORMAT_KEY: VERSION,
        "nodes": {n: [asdict(e) for e in items] for n, items in sorted(record.items())},
    }
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``.NAME.mutex`` beside the record: a sweep's jobs change it one at a time."""
    fd = os.open(path.with_name(f".{path.name}.mutex"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
