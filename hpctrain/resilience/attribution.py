"""Failure attribution: what ended one rank's attempt, as one class the fault policy acts on. Pure: it reads
no file, clock or environment; its supervisor gathers the facts (:mod:`hpctrain.launch.supervision`).

    classify(ExitFacts) -> Attributed(kind, cause, detail)

From the exit status, the error record the worker wrote (its type, message, ``errno`` and path, and whose
frame raised it: the user's code, hpctrain's or a library's), and the host's evidence of an OOM kill:

========================================  ===================  ==========================================
what ended the rank                        kind                 the policy's answer
========================================  ===================  ==========================================
SIGKILL while the OOM killer killed        out of memory        stop: a restart would run out again
a torch/Python out-of-memory error         out of memory        stop
ENOSPC, EDQUOT, EROFS, EACCES on a path,   storage              stop, naming the path: someone must act
or no record and a full run directory
EIO, ESTALE                                io                   the node's mount: restart, or requeue
                                                                without the node
a refusal (ConfigError, a checkpoint       refused              stop: a restart is refused again
that does not fit)
a connection refused or a store timeout    network              restart
in the rendezvous; an object store
(checkpoint.path) that does not answer
a peer's connection reset                  peer                 the cause is another rank's
an error hpctrain's own code raised        hpctrain's bug       stop, with the frame
an error raised in the user's or a         raised               restart; the same one at the same step
library's frame, or injected (faults.*)                         twice is the run's own bug: stop
a signal                                   killed               restart, or requeue without the node
an exit with no record                     exited               restart
========================================  ===================  ==========================================

``cause`` is the exit in the words a supervisor always used ("was killed by SIGKILL", "failed with exit
code 1: ValueError: …"), which the policy compares across attempts; ``detail`` is what attribution adds
(the OOM killer and the peak RSS, the path, the frame).
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from typing import Any

from hpctrain.resilience import policy

# Errors of the storage that a restart meets again until someone acts (frees space, fixes a permission).
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "over the disk quota",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
}
# Errors of this node's view of the storage (a failing disk, an NFS handle gone stale): another node may be
# fine.
IO_ERRNOS = {errno.EIO: "an I/O error", errno.ESTALE: "a stale file handle"}
# Out of memory, as raised: torch's (torch.OutOfMemoryError, torch.cuda.OutOfMemoryError) and Python's.
OOM_TYPES = ("OutOfMemoryError", "MemoryError")
# The rendezvous could not reach its store or its peers (torch.distributed's DistNetworkError,
# DistStoreError; a refused or timed-out connection while joining).
NETWORK_TYPES = ("DistNetworkError", "DistStoreError", "ConnectionRefusedError")
# An object store's client that got no answer (botocore's and aiohttp's, as s3fs raises them; fsspec's own
# timeout): the store or the way to it, not this node or the run.
STORE_TYPES = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ServerTimeoutError",
    "ClientConnectorError",
    "FSTimeoutError",
    "StoreTimeout",  # hpctrain's own bound on a call (hpctrain.rundir.objects.within)
)
# hpctrain's deliberate refusals (errors.ConfigError and its kinds, errors.CheckpointMismatch).
REFUSAL = "refusal"
# Whose frame raised an error (the worker's error record, ``origin``).
USER, HPCTRAIN, LIBRARY, INJECTED = "user", "hpctrain", "library", "injected"
GIB = 1024**3


@dataclass(frozen=True)
class ExitFacts:
    """What a supervisor knows of how one rank's worker ended."""

    code: int  # its exit status; negative: the signal that ended it
    record: dict[str, Any] | None = None  # logs/rank<R>.error.json, as the worker (or a supervisor) wrote it
    oom_killed: bool = False  # the kernel's or the cgroup's OOM killer killed a process here meanwhile
    peak_rss: int | None = None  # bytes: the worker's peak resident set, from its last heartbeat
    peer_symptom: bool = False  # the error only says a peer went away
    storage: str = ""  # the run directory's storage is full, in words (a worker then cannot record its error)
    planned: int | None = None  # bytes: the plan's host memory of a rank (hpctrain.plan.host), when known


@dataclass(frozen=True)
class Attributed:
    kind: str  # one of policy.KINDS
    cause: str  # the exit in a supervisor's words
    detail: str = ""  # what attribution adds: the OOM killer and the RSS, the path, the frame


def classify(facts: ExitFacts) -> Attributed:
    """The class of one rank's exit (module docstring's table)."""
    if facts.code < 0:
        try:
            name = signal.Signals(-facts.code).name
        except ValueError:
            name = f"signal {-facts.code}"
        cause = f"was killed by {name}"
        if facts.code == -signal.SIGKILL and facts.oom_killed:
            rss = f" at {facts.peak_rss / GIB:.2f} GiB peak RSS" if facts.peak_rss else ""
            plan = f" (plan: {facts.planned / GIB:.2f} GiB for the rank)" if facts.planned else ""
            return Attributed(policy.OOM, cause, f"by the kernel's OOM killer{rss}{plan}")
        return Attributed(policy.KILLED, cause)
    record = facts.record
    if record is None:
        if facts.storage:
            return Attributed(policy.STORAGE, f"exited with code {facts.code}", facts.storage)
        return Attributed(policy.EXITED, f"exited with code {facts.code}")
    kind, message = str(record.get("type", "")), str(record.get("message", ""))
    cause = f"failed with exit code {facts.code}: {kind}: {message}"
    if facts.peer_symptom:
        return Attributed(policy.PEER, cause)
    number, path = record.get("errno"), record.get("filename")
    if number is None:  # an error that only says it in words (a save's, relayed from its writer process)
        number = next((n for n in (*STORAGE_ERRNOS, *IO_ERRNOS) if os.strerror(n) in message), None)
    on = f" ({path})" if path else ""
    if kind in OOM_TYPES:
        return Attributed(policy.OOM, cause, "out of memory, as raised")
    if number in STORAGE_ERRNOS:
        return Attributed(policy.STORAGE, cause, f"{STORAGE_ERRNOS[number]}{on}")
    if number in IO_ERRNOS:
        return Attributed(policy.IO, cause, f"{IO_ERRNOS[number]}{on}")
    if record.get("origin") == REFUSAL:
        return Attributed(policy.REFUSED, cause, "hpctrain refused the run")
    if kind in NETWORK_TYPES:
        return Attributed(policy.NETWORK, cause, "the rendezvous could not reach its peers")
    if kind in STORE_TYPES:
        return Attributed(policy.NETWORK, cause, "the checkpoint store did not answer")
    frame = str(record.get("frame") or "")
    if record.get("origin") == HPCTRAIN:
        return Attributed(policy.OWN_BUG, cause, f"in hpctrain's code at {frame}" if frame else "in hpctrain")
    if record.get("origin") == USER and frame:
        return Attributed(policy.RAISED, cause, f"in your code at {frame}")
    if record.get("origin") == INJECTED:
        return Attributed(policy.RAISED, cause, "injected on purpose (faults.*)")
    return Attributed(policy.RAISED, cause)
