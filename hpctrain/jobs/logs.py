"""A rank's log of a run: where it is (the run directory's, or Slurm's output file), its tail, and its new
lines as they come until the job ends. No torch import here."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from hpctrain.jobs.states import COMPLETED, RUNNING, run_state
from hpctrain.jobs.targets import JobsError, Target, state_of
from hpctrain.rundir import RunDir
from hpctrain.slurm import commands, watch

FOLLOW_POLL_S = 0.5  # how often ``logs -f`` looks for new lines (and at the run directory's end)
# When rank 0 of a Slurm job lets go of its run's lock (it ended, or failed), its job is ending or restarting
# it: Slurm is asked directly this long after, instead of at the shared watch's next interval.
AFTER_RELEASE_S = (1.0, 4.0)


def log_paths(target: Target, rank: int) -> tuple[Path | None, Path | None]:
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


def tail(path: Path, n: int) -> tuple[str, int]:
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


def logs(target: Target, follow: bool, n: int, rank: int) -> Iterator[tuple[str, str]]:
    """The tail of rank ``rank``'s log (Slurm's output when the run directory holds none yet), then with
    ``follow`` its new lines until the job ends: ``("out", text)`` for stdout, ``("note", line)`` for
    stderr. A JobsError when there is nothing to show."""
    rank_log, slurm_out = log_paths(target, rank)
    if not follow:
        for path in (rank_log, slurm_out):
            if path is not None and path.is_file():
                if path != rank_log:
                    yield "note", f"no {rank_log} yet: Slurm's output {path}"
                yield "out", tail(path, n)[0]
                return
        raise JobsError(f"no log yet: {rank_log or slurm_out or 'Slurm does not say where the output goes'}")
    path = rank_log or slurm_out
    if path is None:
        raise JobsError(f"{target.text}: Slurm does not say where job {target.job_id} writes its output")
    fallback = slurm_out if path == rank_log else None
    yield from _follow(path, n, target.slurm_id, fallback, target.run_dir)


def _follow(
    path: Path, n: int, job_id: str | None, fallback: Path | None, run_dir: Path | None = None
) -> Iterator[tuple[str, str]]:
    """Print the tail of ``path`` and then its new lines until the job ends (a run here: until it is no
    longer RUNNING, its lock released; a finished run's tail at once)."""
    offset: int | None = None
    partial = b""
    next_check = 0.0
    held = False  # rank 0 of a Slurm job holds the run's lock while it trains
    asks: list[float] = []  # when to ask Slurm directly, after that lock was let go
    final = False
    waiting_said = False
    while True:
        if offset is None and path.is_file():
            text, offset = tail(path, n)
            yield "out", text
        if offset is not None:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            offset += len(data)
            data = partial + data
            cut = data.rfind(b"\n") + 1
            yield "out", data[:cut].decode("utf-8", errors="replace")
            partial = data[cut:]
        if final:
            break
        if job_id is None and run_dir is not None and time.monotonic() >= next_check:
            next_check = time.monotonic() + FOLLOW_POLL_S
            if run_state(run_dir).word != RUNNING:
                final = True  # one more read, then done: a finished run has no new lines to wait for
                continue
        now = time.monotonic()
        if job_id is not None and run_dir is not None:  # once a turn: the loop sleeps FOLLOW_POLL_S
            word = run_state(run_dir).word
            if word == COMPLETED:
                # Its last step written and its lock let go: nothing more to come, no Slurm query needed.
                # (Not a rank's error: a restart inside the job, or its requeue, may still train on.)
                final = True
                continue
            if held and word != RUNNING:  # rank 0 let go of the run: its job may be ending
                asks = [now + delay for delay in AFTER_RELEASE_S]
            held = word == RUNNING
        direct = bool(asks) and now >= asks[0]
        if job_id is not None and (direct or now >= next_check):
            # Slurm's word, shared with the user's other watchers (hpctrain.slurm.watch): a job cancelled,
            # timed out or lost with its node writes no end of its own. Asked directly only just after the
            # run's lock was let go (AFTER_RELEASE_S: an event of each start of its rank 0, not a poll).
            state, _ = state_of(job_id, watched=not direct)
            if direct:
                asks.pop(0)
            else:
                next_check = now + watch.INTERVAL_S
            if state is None or state.final:
                final = True  # one more read: the last lines land as the job ends
                continue
            if offset is None and not waiting_said:
                yield "note", f"waiting for {path} (job {job_id} is {state.state})"
                waiting_said = True
        time.sleep(FOLLOW_POLL_S)
    if partial:
        yield "out", partial.decode("utf-8", errors="replace") + "\n"
    if offset is None:
        if fallback is not None and fallback.is_file():
            yield "note", f"the job ended without {path}: Slurm's output {fallback}"
            yield "out", tail(fallback, n)[0]
        else:
            raise JobsError(f"the job ended without writing {path}")
