"""What a submission leaves behind so that ``hpctrain status | logs | cancel | summary`` can find it later.

<run dir>/job.json      one run: its Slurm job id, launcher, cluster, size, where Slurm writes output
<sweep dir>/sweep.json  a sweep: its array job id and one entry per member (overrides, run dir, job id)
<run dir>/logs/rank<R>.error.json  what a failed rank raised (type, message, traceback, host), written by
                        :mod:`hpctrain.worker`, read by the local launcher and ``hpctrain status``
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.rundir import JOB_RECORD, SWEEP_RECORD, RunDir
from hpctrain.rundir.files import atomic_json

# A worker's exit status when a stop signal ended training before its end (saved): neither done nor failed.
EXIT_STOPPED = 3

# Messages of ranks that failed only because a peer went away (gloo / NCCL / the TCP store).
PEER_ERROR_MARKERS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator",
    "recvBytes",
    "Socket Timeout",
    "Connection refused",
)


@dataclass
class JobRecord:
    job_id: str
    launcher: str  # submitit | sbatch
    cluster: str
    nodes: int
    tasks_per_node: int
    slurm_output: str  # where Slurm writes the tasks' stdout/stderr (a pattern with %j / %t for submitit)
    ranks: int = 0  # the run's world size (its RunShape's, at submission); 0 in records of older versions
    submitted_at: float = field(default_factory=time.time)
    # Submitted from a laptop (cluster.ssh): the login node, the ssh config file, and where the run
    # directory is on the cluster. None in a login node's own records (and in those of older versions).
    ssh: str | None = None
    ssh_config: str | None = None
    remote_run_dir: str | None = None


@dataclass
class SweepMember:
    index: int
    overrides: list[str]
    run_dir: str
    job_id: str  # the Slurm job (array member) that runs it; members of one pack share it
    pack: int | None = None  # with cluster.pack: which pack (one job) runs it, after the pack's earlier ones


@dataclass
class SweepRecord:
    array_job_id: str  # the first array's id ("local" for a sweep run here)
    cluster: str
    members: list[SweepMember]
    submitted_at: float = field(default_factory=time.time)
    # Every array of the sweep: a sweep larger than the site's MaxArraySize is split into several.
    array_job_ids: list[str] = field(default_factory=list)
    # Submitted from a laptop (cluster.ssh): the login node, the ssh config file, and where the sweep
    # directory is on the cluster. None in a login node's own records (and in those of older versions).
    ssh: str | None = None
    ssh_config: str | None = None
    remote_sweep_dir: str | None = None
    # The sweep's own command (hpctrain's arguments as typed, without -m; a secret as ${oc.env:NAME}): what a
    # command reusing the sweep's directory must match (hpctrain.submit.existing.check_sweep_reuse). None in
    # records of older versions.
    command: list[str] | None = None

    @property
    def arrays(self) -> list[str]:
        return self.array_job_ids or [self.array_job_id]


def sweep_argv(argv: list[str]) -> list[str]:
    """A sweep's own command as sweep.json records it (:attr:`SweepRecord.command`): hpctrain's arguments
    without ``-m`` and what hpctrain adds for Hydra alone (:data:`hpctrain.rundir.NO_HYDRA_RECORD`)."""
    from hpctrain.rundir import NO_HYDRA_RECORD

    return [a for a in argv if a not in ("-m", "--multirun", NO_HYDRA_RECORD)]


def write_json(path: Path, record: object) -> None:
    atomic_json(path, asdict(record))  # type: ignore[call-overload]


def read_job(run_dir: Path) -> JobRecord | None:
    path = run_dir / JOB_RECORD
    return JobRecord(**json.loads(path.read_text())) if path.is_file() else None


def read_sweep(sweep_dir: Path) -> SweepRecord | None:
    path = sweep_dir / SWEEP_RECORD
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw["members"] = [SweepMember(**m) for m in raw["members"]]
    return SweepRecord(**raw)


def error_file(run_dir: Path, rank: int) -> Path:
    return RunDir(run_dir).error_file(rank)


def write_error_record(
    run_dir: Path,
    rank: int,
    kind: str,
    message: str,
    trace: str = "",
    user_trace: str | None = None,
    facts: dict[str, Any] | None = None,
) -> None:
    """What a failing rank leaves for launchers and ``hpctrain status``: logs/rank<R>.error.json.
    ``user_trace``: the frames of the user's own code, when their code raised (shown above the one line);
    ``facts``: what failure attribution reads (hpctrain.errors.error_facts: errno, path, origin, frame)."""
    record = {
        **(facts or {}),
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "type": kind,
        "message": message,
        "traceback": trace,
    }
    if user_trace:
        record["user_traceback"] = user_trace
    path = error_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_json(path, record)


KILLED = "Killed"  # the error type of a rank that a signal ended before it could record anything


def record_killed(run_dir: Path, rank: int, signum: int, restarts: int, detail: str = "") -> None:
    """A rank ended by a signal (kill -9, the OOM killer, a lost node) records nothing itself: its observer
    (the local launcher, the Slurm agent) records it, so that ``hpctrain status`` names this rank and not a
    peer's "connection reset". ``restarts``: the run's cluster.max_restarts (0: the line says what would
    have answered it); ``detail``: what attribution found (the OOM killer and the peak RSS)."""
    if read_error_record(run_dir, rank) is not None:
        return
    try:
        name = signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        name = f"signal {signum}"
    hint = "" if restarts else "; cluster.max_restarts=N restarts the ranks inside the allocation, in seconds"
    if detail:  # attribution's (the OOM killer): a restart would not help, so no hint of one
        hint = f" ({detail})"
    write_error_record(run_dir, rank, KILLED, f"was killed by {name}{hint}")


def read_error_record(run_dir: Path, rank: int) -> dict[str, Any] | None:
    """The record a failed rank wrote (rank, host, pid, type, message, traceback), if it wrote one."""
    try:
        record = json.loads(error_file(run_dir, rank).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "type" in record else None


def read_user_traceback(run_dir: Path, rank: int) -> str | None:
    """The user's own frames a failed rank recorded (their code raised), else None."""
    record = read_error_record(run_dir, rank)
    text = record.get("user_traceback") if record is not None else None
    return text if isinstance(text, str) and text else None


def read_error_file(run_dir: Path, rank: int) -> str | None:
    """``Type: message`` of the exception a worker recorded before exiting, if it recorded one."""
    record = read_error_record(run_dir, rank)
    return None if record is None else f"{record['type']}: {record.get('message', '')}"


def is_peer_symptom(message: str) -> bool:
    """Whether an error only says that another rank went away (the cause is elsewhere)."""
    return any(marker in message for marker in PEER_ERROR_MARKERS)


def error_last_line(record: dict[str, Any]) -> str:
    """The last line of the recorded traceback (``Type: message``), as Python prints it last."""
    lines = [line for line in str(record.get("traceback", "")).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"{record['type']}: {record.get('message', '')}"


def first_error(run_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """The error of the lowest rank that failed on its own, else of the lowest rank that failed at all."""
    ranks = sorted(
        int(m.group(1))
        for path in RunDir(run_dir).error_files()
        if (m := re.fullmatch(r"rank(\d+)\.error\.json", path.name))
    )
    found = [(rank, record) for rank in ranks if (record := read_error_record(run_dir, rank)) is not None]
    causes = [(rank, r) for rank, r in found if not is_peer_symptom(error_last_line(r))]
    chosen = causes or found
    return chosen[0] if chosen else None


def split_overrides(members: list[SweepMember]) -> tuple[list[str], list[list[str]]]:
    """The overrides every member shares, and each member's own (all of them when there is one member)."""
    if len(members) < 2:
        return [], [list(m.overrides) for m in members]
    common = [o for o in members[0].overrides if all(o in m.overrides for m in members[1:])]
    return common, [[o for o in m.overrides if o not in common] for m in members]
