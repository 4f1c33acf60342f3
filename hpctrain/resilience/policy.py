"""The fault policy: what answers the end of one attempt of a run. Pure: it reads no file, clock, environment
or Slurm, and imports nothing of hpctrain's; what it is given is all it knows.

    decide(fault, history, caps) -> Restart() | Requeue(exclude) | Fail(error, why)

The supervisors ask it and act: the local launcher and each Slurm task's agent
(:mod:`hpctrain.launch.agent`; :func:`hpctrain.resilience.requeue.respond_to_fault` for a node that failed
its health check or too few nodes left). A worker never does: it records its fault and exits.
Its table test is tests/unit/resilience/test_policy.py: every fault ``bench/chaos.py`` injects, against
every history that changes the answer.

In order (the first that applies answers):

1. An error no restart can heal ends the run: one it asked for (:data:`FINAL_ERRORS`), and the classes a
   restart would meet again (:data:`FINAL_KINDS`: out of memory, a full or refused storage, hpctrain's
   refusal, hpctrain's own bug; :mod:`hpctrain.resilience.attribution` classifies an exit).
2. ``cluster.max_no_progress`` attempts in a row without a new step are a crash loop: the run stops
   (:func:`no_progress_in_a_row`: the one count of them, for restarts and requeues alike). A pre-emption
   is no crash.
3. The same raised error at the same step as an earlier attempt is the run's own bug (its code, data or
   config): a restart would meet it again, so the run stops. A signal, a hang or a lost node is never that.
4. A restart inside the allocation while ``cluster.max_restarts`` has one left; never after a pre-emption
   (the allocation is going away), nor for a second hang on the same node (on Slurm, a requeue without
   that node instead, within ``cluster.max_requeues``: a restart would land on it again).
5. On Slurm, a requeue within ``cluster.max_requeues``, without the culprit's node when the fault was the
   node's (killed, hung, lost, unhealthy); the requeue checks that enough nodes remain.
6. Else the run ends: the caps are used up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# How an attempt ended, as its supervisor saw it.
RAISED = "raised"  # the worker raised an error of its own and recorded it
EXITED = "exited"  # a non-zero exit with no record of why
KILLED = "killed"  # a signal: kill -9, the OOM killer
HUNG = "hung"  # a rank blocked in a collective, named by its peers' watchdog
LOST_NODE = "lost node"  # a node's slurmd and processes gone
PEER = "peer"  # only a peer's failure seen (a connection reset): the real cause is another rank's
UNHEALTHY = "unhealthy"  # the node failed its health check before the worker started
PREEMPTED = "preempted"  # Slurm's signal (a pre-emption, the time limit): the run saved and stops; no fault
OOM = "out of memory"  # the OOM killer (the kernel's, a cgroup's), or an out-of-memory error raised
STORAGE = "storage"  # no space, over quota, read-only, permission denied: someone must act
IO = "io"  # an I/O error or a stale handle: this node's view of the storage
REFUSED = "refused"  # hpctrain refused the run (a config, a checkpoint that does not fit)
NETWORK = "network"  # the rendezvous could not reach its store or peers
OWN_BUG = "hpctrain's bug"  # an error raised in hpctrain's own code
KINDS = (
    RAISED,
    EXITED,
    KILLED,
    HUNG,
    LOST_NODE,
    PEER,
    UNHEALTHY,
    PREEMPTED,
    OOM,
    STORAGE,
    IO,
    REFUSED,
    NETWORK,
    OWN_BUG,
)
# Faults of the node rather than of the run: a requeue leaves the node out.
NODE_FAULTS = (KILLED, HUNG, LOST_NODE, UNHEALTHY, IO)
# Classes a restart would meet again: the run ends at once, saying which (the error type of its record).
FINAL_KINDS = {
    OOM: "OutOfMemory",
    STORAGE: "StorageFault",
    REFUSED: "Refused",
    OWN_BUG: "HpctrainBug",
}
# Why each of FINAL_KINDS is not restarted, in the one line.
_FINAL_WHY = {
    OOM: "out of memory, which a restart would run into again (a smaller batch or more ranks)",
    STORAGE: "the storage refused a write, which a restart would meet again until it is fixed",
    REFUSED: "hpctrain refused the run, and would refuse it again",
    OWN_BUG: "an error in hpctrain's own code, which a restart would meet again (please report it)",
}

# Errors a restart cannot heal, by the type a worker recorded: the run ends as it asked. A refused
# checkpoint (another shape, model or layout than the config's) is refused again by every restart; and once
# rank 0 has put the run's earlier record back, a restart would train that earlier config instead, under a
# job that then reads COMPLETED.
FINAL_ERRORS = ("NonFiniteStop", "CheckpointMismatch")
CRASH_LOOP = "CrashLoop"  # the error type of a run stopped by rule 2
REPEATED = "RepeatedError"  # of a run stopped by rule 3
CAPS_USED = "CapsUsedUp"  # of a run that met rule 6


@dataclass(frozen=True)
class Fault:
    """How one attempt ended."""

    kind: str  # one of KINDS
    cause: str  # in words: "was killed by SIGKILL", "failed with exit code 1: ValueError: …", "hung: …"
    rank: int | None = None
    host: str | None = None
    step: int | None = None  # the step the failing rank was in (its last heartbeat), when known
    progress: bool = True  # whether the attempt trained a step beyond the checkpoint it started from
    error: str | None = None  # the error type the worker recorded, when it did
    detail: str = ""  # what attribution adds: the OOM killer and the RSS, the path, the frame


@dataclass(frozen=True)
class Past:
    """An earlier attempt of the run, as its record (the fault log's answer) keeps it."""

    cause: str
    step: int | None = None  # set for a raised error only
    progress: bool = True
    kind: str | None = None  # the class it was answered as (None in a record from before classes)
    host: str | None = None


@dataclass(frozen=True)
class History:
    past: tuple[Past, ...] = ()  # oldest first
    restarts_done: int = 0  # inside this allocation: the generation that just ended
    requeues_done: int = 0  # the job's requeues so far (Slurm's SLURM_RESTART_COUNT)
    on_slurm: bool = False  # a requeue is possible


@dataclass(frozen=True)
class Caps:
    max_restarts: int  # cluster.max_restarts
    max_no_progress: int  # cluster.max_no_progress (≥ 1)
    max_requeues: int  # cluster.max_requeues


@dataclass(frozen=True)
class Restart:
    """Start the attempt again inside the allocation, from the newest checkpoint."""


@dataclass(frozen=True)
class Requeue:
    """Give the allocation back and queue the job again, without ``exclude``'s nodes."""

    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fail:
    """The run ends: ``error`` is the type its error record takes, ``why`` the one line that says so."""

    error: str
    why: str


Action = Restart | Requeue | Fail


def decide(fault: Fault, history: History, caps: Caps) -> Action:
    """What answers ``fault``, the end of the attempt after ``history``, within ``caps`` (rules 1-6 above)."""
    if fault.error in FINAL_ERRORS:
        return Fail(fault.error, f"not restarted: {fault.error} ends the run as it asked; {fault.cause}")
    if fault.kind in FINAL_KINDS:
        return Fail(FINAL_KINDS[fault.kind], f"not restarted: {_FINAL_WHY[fault.kind]}: {described(fault)}")
    in_a_row = no_progress_in_a_row(history.past, fault.progress or fault.kind == PREEMPTED)
    if in_a_row >= caps.max_no_progress:
        return Fail(
            CRASH_LOOP,
            f"crash loop: {in_a_row} attempt{'s' * (in_a_row > 1)} in a row without a new step "
            f"(cluster.max_no_progress={caps.max_no_progress}); last: {fault.cause}",
        )
    if repeats(fault, history.past):
        return Fail(
            REPEATED,
            f"not restarted: the same error at step {fault.step} twice, so a fault of the run itself (its "
            f"code, data or config), which a restart would meet again: {described(fault)}",
        )
    hung_here_before = fault.kind == HUNG and any(
        p.kind == HUNG and p.host == fault.host for p in history.past
    )
    can_requeue = history.on_slurm and history.requeues_done < caps.max_requeues
    if hung_here_before and fault.host and can_requeue:  # a restart would land on the node again
        return Requeue((fault.host,))
    if history.restarts_done < caps.max_restarts and fault.kind != PREEMPTED:
        return Restart()
    if history.on_slurm and history.requeues_done < caps.max_requeues:
        exclude = (fault.host,) if fault.kind in NODE_FAULTS and fault.host else ()
        return Requeue(exclude)
    if history.on_slurm:
        n = history.requeues_done
        return Fail(
            CAPS_USED,
            f"the job was already requeued {n} time{'s' * (n != 1)} and cluster.max_requeues="
            f"{caps.max_requeues}; last: {described(fault)}",
        )
    return Fail(
        CAPS_USED,
        f"not restarted: {history.restarts_done} of cluster.max_restarts={caps.max_restarts} restarts used; "
        f"{described(fault)}",
    )


def past_from(records: list[dict[str, Any]]) -> tuple[Past, ...]:
    """The earlier attempts from their records (the fault log's answers, oldest first)."""
    return tuple(_past(record) for record in records)


def _past(record: dict[str, Any]) -> Past:
    cause, progress = str(record.get("cause", "")), bool(record.get("progress", True))
    return Past(cause, record.get("step"), progress, kind=record.get("kind"), host=record.get("host"))


def no_progress_in_a_row(past: tuple[Past, ...], progress: bool) -> int:
    """How many attempts in a row, this one included, ended without a new step (0 when this one made one)."""
    if progress:
        return 0
    count = 1
    for earlier in reversed(past):
        if earlier.progress:
            break
        count += 1
    return count


def repeats(fault: Fault, past: tuple[Past, ...]) -> bool:
    """Whether an earlier attempt ended with this raised error at this step."""
    if fault.kind != RAISED or fault.step is None:
        return False
    return any((p.step, p.cause) == (fault.step, fault.cause) for p in past)


def where(fault: Fault) -> str:
    return f"rank {fault.rank} on {fault.host}" if fault.rank is not None else "a rank"


def described(fault: Fault) -> str:
    """Where and what: "rank 1 on node2 was killed by SIGKILL (by the kernel's OOM killer at 1.50 GiB …)"."""
    return f"{where(fault)} {fault.cause}" + (f" ({fault.detail})" if fault.detail else "")


def verdict(fault: Fault, action: Action) -> str:
    """The attempt's one line for ``hpctrain status``: who, what, and the answer."""
    if isinstance(action, Restart):
        return f"{described(fault)} — restarted inside the allocation"
    if isinstance(action, Requeue):
        without = f" without {', '.join(action.exclude)}" if action.exclude else ""
        return f"{described(fault)} — the job requeued{without}"
    reasons = {
        CRASH_LOOP: "a crash loop (cluster.max_no_progress attempts in a row without a new step)",
        REPEATED: "the same error at the same step twice, the run's own bug",
        CAPS_USED: "the restarts and requeues its caps allow are used up",
    }
    kind = next((k for k, error in FINAL_KINDS.items() if error == action.error), None)
    reason = _FINAL_WHY[kind] if kind else reasons.get(action.error, f"{action.error} ends the run")
    return f"{described(fault)} — not restarted: {reason}"
