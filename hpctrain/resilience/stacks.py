"""Every rank's Python stacks, on request, in seconds: ``hpctrain stacks RUN_DIR`` and every hang.

A request is one small file in the run directory (``stacks/request.json``: its name and time), which every
rank's watchdog thread looks at four times a second (:class:`Answerer`, beside its heartbeat): a rank whose
main thread waits in a collective, sleeps in a data loader or spins in Python answers all the same, with
each of its threads' stacks in ``stacks/<request>/rank<R>.txt``. Nothing reaches a node over ssh: the run
directory is the one place every rank and the asking command share, locally and on Slurm. A rank that does
not answer is stopped (SIGSTOP), frozen whole or gone: :func:`collect` names it from its heartbeat's age.

When a watchdog declares a hang it asks too (``hang-<time>``), so the live ranks' stacks land beside its
own traceback. No torch import here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_write

NAME = re.compile(r"[A-Za-z0-9_.-]{1,80}")  # a request's name: a folder of stacks/


def ask(run_dir: Path, name: str | None = None) -> str:
    """Ask every live rank of ``run_dir`` for its stacks; the request's name (its folder under stacks/)."""
    name = name or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    rd = RunDir(run_dir)
    rd.stacks.mkdir(parents=True, exist_ok=True)
    atomic_write(rd.stacks_request, json.dumps({"name": name, "time": time.time()}))
    return name


class Answerer:
    """One rank's side: :meth:`poll` (from the watchdog thread) answers a request it has not answered yet."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.rd, self.rank = RunDir(run_dir), rank
        self._seen = self._mtime()  # a request older than this process is not for it

    def _mtime(self) -> int:
        try:
            return os.stat(self.rd.stacks_request).st_mtime_ns
        except OSError:
            return 0

    def poll(self) -> None:
        mtime = self._mtime()
        if mtime == self._seen:
            return
        self._seen = mtime
        try:
            name = str(json.loads(self.rd.stacks_request.read_text())["name"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if NAME.fullmatch(name):
            self.dump(name)

    def dump(self, name: str) -> None:
        """This process's threads' stacks, the main thread's first, into ``stacks/<name>/rank<R>.txt``."""
        save(
            self.rd.path, name, self.rank, format_threads()
        )  # not saved (a full disk): the log has the hang's


def format_threads() -> str:
    """Every thread's stack, as Python prints a traceback (most recent call last), the main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: ident != main)
    parts = []
    for ident in order:
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f"Thread {names.get(ident, ident)} (most recent call last):\n{stack}")
    return "\n".join(parts)


def innermost(text: str) -> str:
    """The main thread's innermost frame of a dump, ``file:line in function``: its first thread's last frame
    (Python's traceback order), or its first Python frame in py-spy's (innermost first; native frames, a
    ``.so``'s, skipped)."""
    if text.startswith(UNREAD):
        return "does not run (stopped or frozen); py-spy would read where"
    if text.startswith(SPY_HEADER):
        block = text.split("\nThread ", 2)[1] if "\nThread " in text else ""
        spied = re.findall(r"^ {4}(\S+) \((.+?):(\d+)\)$", block, re.M)
        if spied:
            function, file, line = spied[0]
            return f"{function} ({_short(file)}:{line})"
        return "no Python frame"
    first = text.split("\nThread ", 1)[0]
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', first)
    if not found:
        return "no Python frame"
    file, line, function = found[-1]
    return f"{function} ({_short(file)}:{line})"


SPY_HEADER = "Process "  # py-spy dump's first line: "Process PID: COMMAND"
UNREAD = "Not read: "  # a stopped rank's file when py-spy is not installed
SPY_TIMEOUT_S = 5.0


def spy_path() -> str | None:
    """py-spy (``pip install py-spy``, or hpctrain's ``debug`` extra): on PATH or beside this Python."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def read_stopped(pid: int) -> str | None:
    """The Python stacks of process ``pid``, read by py-spy from its memory without pausing it
    (``--nonblocking``): the one way to see where a stopped (SIGSTOP) or frozen rank stands, since it
    answers no request. None without py-spy, or when it cannot read the process (not ours, gone)."""
    spy = spy_path()
    if spy is None:
        return None
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=SPY_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and "\nThread " in done.stdout else None


def dump_stopped(run_dir: Path, name: str, rank: int, pid: int) -> Path | None:
    """Rank ``rank``'s stacks into request ``name``'s folder, read from outside the process (it answers
    nothing itself): py-spy's dump, else a line saying how to get one. None when nothing could be written."""
    text = read_stopped(pid) or (
        f"{UNREAD}rank {rank} (pid {pid}) does not run (stopped or frozen): its stacks can be read from "
        "outside with py-spy (pip install py-spy), which was not found\n"
    )
    return save(run_dir, name, rank, text)


def save(run_dir: Path, name: str, rank: int, text: str) -> Path | None:
    """Rank ``rank``'s stacks as request ``name``'s answer, ``stacks/<name>/rank<R>.txt``; None when it
    cannot be written (a full disk)."""
    path = RunDir(run_dir).stack_dump(name, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    except OSError:
        return None
    return path


def _short(file: str) -> str:
    """A frame's file from the package down (hpctrain/train/step.py, torch/distributed/…)."""
    parts = Path(file).parts
    for root in ("hpctrain", "torch", "site-packages"):
        if root in parts:
            index = parts.index(root) + (root == "site-packages")
            return "/".join(parts[index:])
    return file


def group(stacks: dict[int, str]) -> list[str]:
    """Ranks grouped by where their main thread is: "ranks 0, 2-3: all_reduce (torch/…:88)"."""
    by_frame: dict[str, list[int]] = {}
    for rank in sorted(stacks):
        by_frame.setdefault(innermost(stacks[rank]), []).append(rank)
    return [f"{_ranks(ranks)}: {frame}" for frame, ranks in by_frame.items()]


def _ranks(ranks: list[int]) -> str:
    """ "rank 3", "ranks 0, 2-3"."""
    spans: list[tuple[int, int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], rank)
        else:
            spans.append((rank, rank))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' * (len(ranks) > 1)} {text}"


def newest(run_dir: Path) -> tuple[Path, dict[int, str]] | None:
    """The newest answered request of ``run_dir`` (a hang's, or hpctrain stacks'): its folder and its stacks
    by rank; None when there is none."""
    try:
        folders = [p for p in RunDir(run_dir).stacks.iterdir() if p.is_dir()]
    except OSError:
        return None
    for folder in sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True):
        found = {}
        for path in folder.glob("rank*.txt"):
            rank = path.stem.removeprefix("rank")
            if rank.isdigit():
                with contextlib.suppress(OSError):
                    found[int(rank)] = path.read_text()
        if found:
            return folder, found
    return None


def dump_flight_record(run_dir: Path, name: str, rank: int) -> None:
    """On an NCCL run: the flight recorder's record of this rank's last collectives, beside its stacks of
    request ``name`` (hpctrain.rendezvous.group.arm_flight_recorder turned it on). Nothing where there is
    none (a gloo run, a torch without NCCL)."""
    from hpctrain import torchapi

    try:
        record = torchapi.nccl_flight_record()
    except RuntimeError:  # the recorder was not on
        return
    if record:
        with contextlib.suppress(OSError):
            atomic_write(RunDir(run_dir).flight_dump(name, rank), record)
