"""``hpctrain stacks RUN_DIR``: every rank's Python stacks in seconds, grouped by where they stand.

The request goes through the run directory (:mod:`hpctrain.resilience.stacks`): each live rank's watchdog
thread answers within a quarter of a second, locally and on Slurm, with no ssh into a node. Ranks whose
main threads stand at the same frame are one line; a rank that does not answer within ``--wait`` is named
with its last heartbeat (a stopped or frozen process answers nothing); one that runs on this machine is read
by py-spy when it is installed, as its supervisor reads one it finds stalled. The answers stay in
``stacks/<request>/``.
No torch import here.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

from hpctrain.jobs.control import live_run
from hpctrain.jobs.targets import JobsError
from hpctrain.resilience import stacks
from hpctrain.resilience.watchdog import read_heartbeats
from hpctrain.rundir import RunDir

POLL_S = 0.05


def expected_ranks(run_dir: Path) -> list[dict]:
    """The ranks of the run's newest start (ranks.json: rank, host, pid)."""
    try:
        found = json.loads(RunDir(run_dir).ranks.read_text())
    except (OSError, ValueError):
        return []
    return [r for r in found if isinstance(r, dict) and isinstance(r.get("rank"), int)]


def collect(run_dir: Path, wait_s: float) -> tuple[str, dict[int, str], list[dict]]:
    """Ask, then wait up to ``wait_s`` for every expected rank: the request's name, the stacks that came
    (by rank), and the ranks that did not answer."""
    ranks = expected_ranks(run_dir)
    name = stacks.ask(run_dir)
    deadline = time.monotonic() + wait_s
    found: dict[int, str] = {}
    while True:
        for entry in ranks:
            rank = entry["rank"]
            if rank not in found:
                with contextlib.suppress(OSError):  # not answered yet
                    found[rank] = RunDir(run_dir).stack_dump(name, rank).read_text()
        if len(found) == len(ranks) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return name, found, [r for r in ranks if r["rank"] not in found]


def report(run_dir: Path, wait_s: float) -> tuple[list[str], bool]:
    """The lines ``hpctrain stacks`` prints, and whether every rank answered. JobsError: not a running run
    (one line)."""
    live_run(run_dir, "show its stacks")
    if not expected_ranks(run_dir):
        raise JobsError(f"{run_dir}: no rank has started yet (no ranks.json): no stack to show")
    name, found, silent = collect(run_dir, wait_s)
    spied = _read_here(run_dir, name, silent)  # a stopped rank on this machine: py-spy reads it all the same
    found.update(spied)
    lines = stacks.group(found) if found else []
    now = time.time()
    beats = {b.rank: b for b in read_heartbeats(run_dir)}
    for entry in silent:
        if entry["rank"] in spied:
            lines.append(f"rank {entry['rank']}: no answer (it does not run); its stacks read by py-spy")
            continue
        beat = beats.get(entry["rank"])
        seen = (
            f"last heartbeat {now - beat.written:.0f} s ago in step {beat.step} ({beat.phase})"
            if beat is not None
            else "no heartbeat"
        )
        closed = beat is not None and beat.closed
        why = "its loop had ended" if closed else "stopped (SIGSTOP), frozen whole, or gone"
        lines.append(
            f"rank {entry['rank']} on {entry.get('host', '?')} (pid {entry.get('pid', '?')}): no answer in "
            f"{wait_s:g} s: {why}; {seen}"
        )
    lines.append(f"stacks: {RunDir(run_dir).stacks / name}")
    return lines, not silent


def _read_here(run_dir: Path, name: str, silent: list[dict]) -> dict[int, str]:
    """The stacks py-spy reads of the silent ranks that run on this machine (a pid gone reads as nothing),
    each also written beside the others' answers."""
    here = socket.gethostname()
    read = {}
    for entry in silent:
        pid = entry.get("pid")
        if entry.get("host") != here or not isinstance(pid, int):
            continue
        text = stacks.read_stopped(pid)
        if text is not None:
            read[entry["rank"]] = text
            stacks.save(run_dir, name, entry["rank"], text)
    return read
