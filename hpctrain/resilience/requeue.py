"""After a stop with a checkpoint saved: requeue the Slurm job (once, from rank 0), up to a cap.

Slurm counts the job's requeues in SLURM_RESTART_COUNT, whoever asked for them, so the cap holds across
pre-emptions, time limits and faults alike. Past ``cluster.max_requeues`` the job ends FAILED, saying why.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Protocol

from hpctrain.resilience import policy
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from hpctrain.slurm import badnodes, commands
from hpctrain.slurm.spec import expand_nodelist

log = logging.getLogger(__name__)


class RequeueCapReached(RuntimeError):
    pass


class RequeueFailed(RuntimeError):
    """Slurm refused to requeue a stopped job: it must end FAILED with the reason, not COMPLETED."""


# States of a job that Slurm itself is requeueing (a pre-empting partition with PreemptMode=REQUEUE).
BEING_REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED")


def slurm_job_id() -> str | None:
    """This job as Slurm commands must name it (None outside Slurm, or under the local launcher).

    A job-array task is ``<array id>_<task id>``: its own SLURM_JOB_ID may equal the array's id, and
    ``scontrol requeue <array id>`` would requeue every member of the sweep."""
    if "HPCTRAIN_LAUNCHER_PID" in os.environ:  # the local launcher (a Slurm agent sets HPCTRAIN_AGENT_PID)
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def excluded_nodes(run_dir: Path) -> set[str]:
    """The nodes this run lost (faults.jsonl records with ``"excluded": true``: a node lost inside the
    allocation, hpctrain.launch.nodes): no later rendezvous or requeue of the run takes them back."""

    return {str(r["host"]) for r in RunDir(run_dir).read_faults() if r.get("excluded") and r.get("host")}


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def requeue_or_fail(
    job_id: str, reason: str, step: int, max_requeues: int, is_main: bool, run_dir: Path | None = None
) -> None:
    """Requeue ``job_id`` (rank 0 asks), or raise RequeueCapReached on every rank when the cap is reached.
    A job that was cancelled is left to end. ``run_dir``: the nodes the run lost are excluded from the
    requeued job."""
    if commands.was_cancelled(job_id):
        log.info("Stopped by %s %s: the job was cancelled, not requeueing", reason, _saved(step))
        return
    done = restart_count()
    fault = policy.Fault(policy.PREEMPTED, f"stopped by {reason}", step=step)
    caps = policy.Caps(0, sys.maxsize, max_requeues)
    if isinstance(policy.decide(fault, policy.History(requeues_done=done, on_slurm=True), caps), policy.Fail):
        raise RequeueCapReached(
            f"stopped by {reason} {_saved(step)}, but the job was already requeued {done} "
            f"time{'s' * (done != 1)} and cluster.max_requeues={max_requeues}: not requeueing. "
            "Resubmit with trainer.resume=auto to continue."
        )
    if is_main:
        log.info(
            "Stopped by %s %s; requeueing job %s (requeue %d of at most %d)",
            reason,
            _saved(step),
            job_id,
            done + 1,
            max_requeues,
        )
        result = _requeue(job_id)
        lost = excluded_nodes(run_dir) if run_dir is not None and result.ok else set()
        exclude = _exclusion(job_id, None, lost) if lost else None
        if exclude:  # while the requeued job is pending, as respond_to_fault does
            _logged(commands.update_job(job_id, {"ExcNodeList": exclude}, attempts=5, ignore_sigterm=True))
        if not result.ok:
            why = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
            state = commands.job_fields(job_id).get("JobState", "")
            if state not in BEING_REQUEUED:
                raise RequeueFailed(
                    f"stopped by {reason} {_saved(step)}, but scontrol requeue {job_id} "
                    f"failed: {why}. Resubmit with trainer.resume=auto to continue."
                )
            # A pre-empting partition with PreemptMode=REQUEUE requeues the job itself: then this is a no-op.
            log.warning(
                "scontrol requeue %s failed (%s) while Slurm requeues the job itself (%s); %s either way",
                job_id,
                why,
                state,
                _saved(step),
            )


def _requeue(job_id: str, attempts: int = 1, ignore_sigterm: bool = False) -> commands.Outcome:
    """``scontrol requeue`` (:func:`hpctrain.slurm.commands.requeue`); once requeued, a ``cluster.time_min``
    job asks for its whole ``cluster.time`` again. Where the site does not let it, the run goes on in starts
    as short as the limit backfill granted, and says so."""
    result = commands.requeue(job_id, attempts, ignore_sigterm)
    outcome = commands.ask_requested_time(job_id, attempts, ignore_sigterm) if result.ok else None
    if outcome is not None and not outcome.ok:
        why = (outcome.stderr or outcome.stdout).strip() or f"exit {outcome.returncode}"
        log.warning(
            "Job %s keeps the time limit backfill granted it (%s: raising a limit may take a Slurm "
            "operator); each start of this run is that long",
            job_id,
            why,
        )
    return result


def _saved(step: int) -> str:
    """What was kept: hpctrain's checkpoint of ``step``, or (step < 0) whatever the user's script saved."""
    return f"at step {step} (checkpoint saved)" if step >= 0 else "(the script saved its own state)"


def respond_to_fault(
    run_dir: Path,
    job_id: str | None,
    culprit: Heartbeat | None,
    why: str,
    max_requeues: int,
    kind: str = policy.KILLED,
) -> None:
    """A supervisor's answer to a fault of its node that no restart inside the allocation answers (a node that
    failed its health check, fewer nodes left than ``cluster.min_nodes``): record the culprit, ask the fault
    policy and act, a requeue without the culprit's node (when the partition has enough other nodes) within
    the requeue cap, or the end. The first to get here acts; the others only log. ``kind``: the policy's
    word for the fault. A worker never calls this: it records its fault and exits, and its Slurm task's agent
    answers (hpctrain.launch.agent)."""
    where = f"rank {culprit.rank} on {culprit.host}" if culprit else "an unknown rank"
    log.error("Fault: %s — %s", where, why)
    done = restart_count()
    if not _first_to_respond(run_dir, job_id, done):
        return
    record = {
        "time": time.time(),
        "job_id": job_id,
        "restart": done,
        "rank": culprit.rank if culprit else None,
        "host": culprit.host if culprit else None,
        "step": culprit.step if culprit else None,
        "why": why,
    }
    RunDir(run_dir).append_fault(record)
    if job_id is None:
        return
    fault = policy.Fault(kind, why, record["rank"], record["host"])
    history = policy.History(requeues_done=done, on_slurm=True)
    # No restart inside the allocation answers these: the policy's rules 5 and 6.
    action = policy.decide(fault, history, policy.Caps(0, sys.maxsize, max_requeues))
    if isinstance(action, policy.Fail):
        log.error("Not requeueing: %s", action.why)
        return
    assert isinstance(action, policy.Requeue)
    requeue_job(run_dir, job_id, culprit.host if culprit and action.exclude else None, kind, why)


def requeue_job(run_dir: Path, job_id: str, host: str | None, kind: str = "", why: str = "") -> None:
    """The policy's Requeue, carried out: ``scontrol requeue`` of ``job_id``, then (while the requeued job is
    pending) an exclusion of ``host``'s node and of the nodes the run lost, when the partition keeps enough
    other nodes. ``host``'s node also goes into the project's node record (``kind``, ``why``: its
    evidence), so that the project's next jobs leave it out. A job that was cancelled is left to end."""
    if commands.was_cancelled(job_id):
        log.info("Not requeueing job %s: it was cancelled", job_id)
        return
    if host:
        note_bad_node(run_dir, host, kind or "fault", why, job_id)
    lost = excluded_nodes(run_dir)
    exclude = _exclusion(job_id, host, lost) if host or lost else None
    _logged(_requeue(job_id, attempts=5, ignore_sigterm=True))
    # Slurm takes an exclusion only while the job is pending: now, while the requeued job waits for its old
    # credentials to expire. No requeuehold: a job left held by a failed release would never run again.
    if exclude and _logged(
        commands.update_job(job_id, {"ExcNodeList": exclude}, attempts=5, ignore_sigterm=True)
    ):
        log.info("Requeued job %s without %s (excluded: %s)", job_id, host or "", exclude)


def note_bad_node(run_dir: Path, host: str, kind: str, why: str, job_id: str | None) -> None:
    """``host`` into the project's node record (hpctrain.slurm.badnodes), where the job has one (its job
    script exports the path). A record that cannot be written is logged and left: this run excludes the node
    all the same, and only the project's next runs miss it."""
    path = os.environ.get(badnodes.RECORD_ENV)
    if not path:
        return
    try:
        badnodes.remember(Path(path), host, kind, why, str(run_dir), job_id or "")
    except (OSError, badnodes.RecordError) as err:
        log.warning("The project's node record was not updated (%s); this run still leaves %s out", err, host)


class Culprit(Protocol):
    """Where a fault was: a heartbeat, or a supervisor's outcome."""

    @property
    def rank(self) -> int | None: ...
    @property
    def host(self) -> str | None: ...
    @property
    def step(self) -> int | None: ...


def record_fault(
    run_dir: Path,
    job_id: str | None,
    culprit: Culprit | None,
    why: str,
    action: str,
    launch: str | None = None,
    generation: int | None = None,
) -> None:
    """A fault's line in faults.jsonl, with the answer (``action``), from the first to see it in this start
    (the others only log): a worker's watchdog that saw a peer hang (its supervisor answers), a supervisor
    that saw its worker stall, or the supervisor that answered a fault with a requeue or the end. A worker
    passes neither ``launch`` nor ``generation`` (its environment says them); a supervisor passes those of
    the workers it started."""
    where = f"rank {culprit.rank} on {culprit.host}" if culprit else "an unknown rank"
    log.error("Fault: %s — %s (%s)", where, why, action)
    launch = launch or job_id or os.environ.get("HPCTRAIN_JOB_ID", "local")
    if generation is None:
        generation = int(os.environ.get("HPCTRAIN_RESTART", "0") or 0)
    key = f"{launch}.g{generation}"
    if not _first_to_respond(run_dir, key, restart_count()):
        return
    RunDir(run_dir).append_fault(
        {
            "time": time.time(),
            "job_id": job_id,
            "restart": restart_count(),
            "generation": generation,
            "rank": culprit.rank if culprit else None,
            "host": culprit.host if culprit else None,
            "step": culprit.step if culprit else None,
            "why": why,
            "action": action,
        }
    )


def _first_to_respond(run_dir: Path, job_id: str | None, restart: int) -> bool:
    """Claim the response to this start's fault: an exclusive create succeeds for one rank only."""
    try:
        fd = os.open(RunDir(run_dir).fault_claim(str(job_id), restart), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _logged(result: commands.Outcome) -> bool:
    """Whether an scontrol call succeeded (tried 5 times, immune to the SIGTERM that a requeue sends the
    job's processes, this one included); a warning when it did not."""
    if not result.ok:
        log.warning(
            "%s failed (exit %d): %s",
            result.command,
            result.returncode,
            (result.stderr or result.stdout).strip(),
        )
    return result.ok


def _exclusion(job_id: str, host: str | None, lost: set[str] | None = None) -> str | None:
    """The job's excluded nodes plus ``host`` and the nodes the run lost (``lost``), or None when too few
    nodes would remain to run it."""
    fields = commands.job_fields(job_id)
    excluded = (
        [] if fields.get("ExcNodeList", "(null)") == "(null)" else expand_nodelist(fields["ExcNodeList"])
    )
    partition = fields.get("Partition", os.environ.get("SLURM_JOB_PARTITION", ""))
    adding = ({host} if host else set()) | (lost or set())
    available = commands.partition_nodes(partition) - set(excluded) - adding
    needed = int(os.environ.get("SLURM_JOB_NUM_NODES", fields.get("NumNodes", "1").split("-")[0]))
    if len(available) < needed:
        log.warning(
            "Not excluding %s: only %d other node(s) in partition %s, the job needs %d",
            ",".join(sorted(adding)),
            len(available),
            partition,
            needed,
        )
        return None
    return ",".join(sorted({*excluded, *adding}))
