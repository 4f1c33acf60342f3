"""Every Slurm client command hpctrain runs (sbatch, squeue, sacct, scancel, scontrol, sinfo): the only module
that starts one.

From a login node (submit, ``hpctrain jobs``): :func:`run` and the functions on it run a client only when
SLURM_CONF or /etc/slurm/slurm.conf is there, unless HPCTRAIN_SLURM_CONFIGLESS=1 says the site really is
configless: a client that finds no configuration falls back to DNS SRV look-ups (configless mode), and on a
machine that is not meant to do that, every call would try to leave it. A failure raises.

From inside a running job (:mod:`hpctrain.resilience`: requeue, exclude a node, the end time): the job's
node has the configuration Slurm started it with, and a failure is the caller's to handle (a requeue that
fails is logged, not raised), so these functions report the exit status instead of raising, and check for
no client (``check_client`` looks for sbatch, a login-node tool).

From a laptop (``cluster.ssh``): after :func:`use_remote`, :func:`run` and the functions on it run each
client on the cluster's login node over ssh (:mod:`hpctrain.slurm.remote`, each word quoted for the remote
shell), where the cluster's own configuration is; nothing is asked of a Slurm client here. An ssh failure
raises SlurmUnavailable with one line naming cluster.ssh and the host.

Over 400 lines: every client command hpctrain runs is here by rule (one place to audit what reaches Slurm),
with the parsing of their answers beside them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.slurm.remote import Remote, RemoteError
from hpctrain.slurm.spec import expand_nodelist

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
# sacct states that mean the job will not run again (requeues end in PENDING/REQUEUED instead).
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class SlurmUnavailable(RuntimeError):
    pass


_remote: Remote | None = None  # cluster.ssh: where the login-node commands run (use_remote)


@contextlib.contextmanager
def use_remote(remote: Remote | None) -> Iterator[None]:
    """Within the block, run the login-node commands on ``remote`` over ssh (None: here)."""
    global _remote
    before, _remote = _remote, remote
    try:
        yield
    finally:
        _remote = before


def remote() -> Remote | None:
    """The login node the commands run on, as :func:`use_remote` set it (None: here)."""
    return _remote


def check_client() -> None:
    """Raise SlurmUnavailable unless a Slurm client can run here without guessing its controller (over
    ssh, the login node has it: an ssh failure is said by the command that meets it)."""
    if _remote is not None:
        return
    if shutil.which("sbatch") is None:
        raise SlurmUnavailable("no Slurm client here (sbatch is not on PATH): submit from a login node")
    conf = os.environ.get("SLURM_CONF")
    if conf is not None and not Path(conf).is_file():
        raise SlurmUnavailable(f"SLURM_CONF={conf} does not exist")
    if conf is None and not DEFAULT_CONF.is_file() and os.environ.get("HPCTRAIN_SLURM_CONFIGLESS") != "1":
        raise SlurmUnavailable(
            f"no Slurm configuration: SLURM_CONF is unset and {DEFAULT_CONF} is missing "
            "(set HPCTRAIN_SLURM_CONFIGLESS=1 on a configless site)"
        )


def _client(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one client command here, or on the login node over ssh (SlurmUnavailable when ssh fails)."""
    if _remote is None:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    try:
        done = _remote.run(args, timeout=timeout)
    except RemoteError as err:
        raise SlurmUnavailable(str(err)) from None
    return subprocess.CompletedProcess(args, done.returncode, done.stdout, done.stderr)


def run(args: list[str], timeout: float = 60) -> str:
    check_client()
    result = _client(args, timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def submit_script(script: Path, chdir: Path | None = None) -> str:
    """``sbatch --parsable SCRIPT``: the new job's id (without a cluster name). ``chdir``: the job's working
    directory (default: the one sbatch runs in)."""
    where = [f"--chdir={chdir}"] if chdir is not None else []
    return run(["sbatch", "--parsable", *where, str(script)]).strip().split(";")[0]


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's state word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...
    exit_code: str
    nodes: str
    elapsed: str
    reason: str = ""  # why a pending job waits (Resources, Priority, ...), from squeue
    start: str = ""  # a pending job's start as Slurm's scheduler estimates it (squeue %S), "" when unknown

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# A job id as squeue/sacct take it: 123, or 123_4 for one member of a job array.
JOB_ID = re.compile(r"\d+(_\d+)?")


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Each job's current state: squeue while it is queued or running, else sacct's record.

    For a job array's id, the answer holds its members (``12_0``, ``12_1``, or ``12_[2-5]`` for members that
    never started) instead. Ids that are not Slurm job ids, or that Slurm does not know, are left out.
    """
    job_ids = [j for j in dict.fromkeys(job_ids) if JOB_ID.fullmatch(j)]
    if not job_ids:
        return {}
    try:
        states = _squeue(["--jobs", ",".join(job_ids)])
    except RuntimeError as err:  # a single id that left slurmctld's memory: "Invalid job id specified"
        if "Invalid job id" not in str(err):
            raise
        states = {}
    missing = [j for j in job_ids if j not in states]
    if missing:
        states.update(
            {j: s for j, s in _sacct(missing).items() if j in missing or j.split("_")[0] in missing}
        )
    # Array members that never started have no record of their own, only the array's (12_[0-3]).
    unstarted = [j for j in missing if j not in states and "_" in j]
    if unstarted:
        arrays = _sacct(sorted({j.split("_")[0] for j in unstarted}))
        for job in unstarted:
            array, index = job.split("_")
            for key, record in arrays.items():
                if key.split("_")[0] == array and int(index) in _array_indices(key):
                    states[job] = JobState(job, record.state, record.exit_code, record.nodes, record.elapsed)
    return states


def user_queue() -> dict[str, JobState]:
    """Every job of this user that slurmctld holds (queued, running, just ended), each array member on its own
    line: one request however many jobs (:mod:`hpctrain.slurm.watch` shares it between watchers)."""
    return _squeue(["--me"])  # the user the client runs as: over cluster.ssh, the login node's


def _squeue(selection: list[str]) -> dict[str, JobState]:
    # --array: one line per array member, even for pending members (squeue folds them into 12_[0-3]).
    fmt = "%i|%T|%N|%M|%r|%S"
    out = run(["squeue", "--noheader", "--array", *selection, "--format", fmt])
    states: dict[str, JobState] = {}
    for line in out.splitlines():
        job, state, nodes, elapsed, reason, start = line.split("|")
        # %S is the start for a running job, Slurm's estimate for a pending one (N/A until it has one).
        start = start if state == "PENDING" and start[:1].isdigit() else ""
        states[job] = JobState(job, state, "", nodes, elapsed, "" if reason == "None" else reason, start)
    return states


def _sacct(job_ids: list[str]) -> dict[str, JobState]:
    out = run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--jobs",
            ",".join(job_ids),
            "--format",
            "JobID,State,ExitCode,NodeList,Elapsed",
        ]
    )
    states: dict[str, JobState] = {}
    for line in out.splitlines():
        job, state, exit_code, nodes, elapsed = line.split("|")
        # "CANCELLED by 0" → CANCELLED; sacct lists a requeued job once per run, the last is current.
        states[job] = JobState(job, state.split()[0], exit_code, nodes, elapsed)
    return states


@dataclass(frozen=True)
class Instance:
    """One run of a job in Slurm's accounting (a requeued job has one per start): seconds since the epoch;
    ``start`` None while it waits, ``end`` None while it runs."""

    job_id: str
    submit: float
    start: float | None
    end: float | None


def job_instances(job_ids: list[str]) -> list[Instance]:
    """Every start of each job (sacct --duplicates: a requeue is a new submit time), oldest first."""
    job_ids = [j for j in dict.fromkeys(job_ids) if JOB_ID.fullmatch(j)]
    if not job_ids:
        return []
    fields = "JobIDRaw,Submit,Start,End"
    args = [
        "sacct",
        "--noheader",
        "--parsable2",
        "--allocations",
        "--duplicates",
        "--jobs",
        ",".join(job_ids),
    ]
    found = []
    for line in run([*args, "--format", fields]).splitlines():
        job, submit, start, end = line.split("|")
        if _when(submit) is not None:
            found.append(Instance(job, _when(submit) or 0.0, _when(start), _when(end)))
    return sorted(found, key=lambda i: i.submit)


def _when(text: str) -> float | None:
    """sacct's local time (2026-12-07T07:44:33) in seconds; None for Unknown, None or empty."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _array_indices(job_id: str) -> set[int]:
    """The member indices sacct folds into one record: ``12_[0-3,7%2]`` → {0, 1, 2, 3, 7}; ``12_5`` → {5}."""
    _, _, spec = job_id.partition("_")
    indices: set[int] = set()
    for part in spec.strip("[]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            indices.update(range(int(low), int(high or low) + 1))
    return indices


def show_job(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``'s fields (StdOut, WorkDir, JobState, ...) while slurmctld still knows the job.

    For an array id, the first member's record.
    """
    try:
        out = run(["scontrol", "--oneliner", "show", "job", job_id])
    except RuntimeError as err:
        if "Invalid job id" in str(err):
            return None
        raise
    line = next((line for line in out.splitlines() if line.strip()), "")
    return _fields(line) or None


def _fields(text: str) -> dict[str, str]:
    """``scontrol show``'s Key=Value fields, separated by spaces or newlines; a value may itself hold spaces
    (Command=, Comment=). For several records, the last one's value of each key."""
    parts = re.split(r"(?:^|\s)([A-Za-z][\w:/]*)=", text)
    return {key: value.strip() for key, value in zip(parts[1::2], parts[2::2], strict=True)}


def cancel(job_ids: list[str]) -> None:
    """scancel for good. A job that is stopped by SIGTERM saves a checkpoint and requeues itself
    (:mod:`hpctrain.resilience`), and it cannot tell scancel's SIGTERM from pre-emption's: so the jobs are
    first made non-requeueable (``Requeue=0``), which makes their ``scontrol requeue`` fail."""
    if not job_ids:
        return
    # One request for the lot (scontrol takes a list; an array's id stands for its members), not one per job:
    # a sweep's cancel costs two RPCs whatever its size. It fails for a job that already ended, or where a
    # site forbids it: scancel still stops the job.
    with contextlib.suppress(RuntimeError):
        run(["scontrol", "update", f"JobId={','.join(job_ids)}", "Requeue=0"])
    run(["scancel", *job_ids])


@dataclass(frozen=True)
class SiteLimits:
    """What the site and the user's association allow a submission (``scontrol show config``, ``sacctmgr``).

    ``max_array_size``: an array's indices run 0 .. MaxArraySize-1, so one array holds at most that many
    members. ``max_submit_jobs``: the user's MaxSubmitJobs (an array of N counts N jobs), None where there is
    none or accounting does not answer.
    """

    max_array_size: int
    max_submit_jobs: int | None = None


DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf(5)'s default


def site_limits() -> SiteLimits:
    """The site's MaxArraySize and the user's job limits; accounting that does not answer is no limit."""
    config = _fields_lines(run(["scontrol", "show", "config"]))
    try:
        max_array = int(config.get("MaxArraySize", DEFAULT_MAX_ARRAY_SIZE))
    except ValueError:
        max_array = DEFAULT_MAX_ARRAY_SIZE
    max_submit: int | None = None
    if config.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none":
        user = (_remote.user if _remote is not None else None) or os.environ.get("USER") or _user_name()
        try:
            out = run(
                [
                    "sacctmgr",
                    "--noheader",
                    "--parsable2",
                    "show",
                    "assoc",
                    f"where user={user}",
                    "format=MaxSubmitJobs,GrpSubmitJobs",
                ],
                timeout=20,
            )
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            out = ""  # slurmdbd down or no association: Slurm itself will say so at sbatch
        limits = [int(v) for line in out.splitlines() for v in line.split("|") if v.strip().isdigit()]
        max_submit = min(limits) if limits else None
    return SiteLimits(max(1, max_array), max_submit)


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _fields_lines(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = Value`` lines."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found[key.strip()] = value.strip()
    return found


def partitions() -> list[str]:
    """The cluster's partitions (sinfo), the default one first as sinfo lists it, without its ``*``."""
    names = run(["sinfo", "--noheader", "--format", "%P"]).split()
    return list(dict.fromkeys(name.rstrip("*") for name in names))


def partition_pool(partition: str | None) -> set[str]:
    """The host names of the nodes a job of ``cluster.partition`` can land on: those of each listed
    partition (``a,b``), or of the default one (sinfo's ``*``) when None."""
    wanted = set(partition.split(",")) if partition else None
    pool: set[str] = set()
    for line in run(["sinfo", "--noheader", "--format", "%P %N"]).splitlines():
        name, _, nodelist = line.strip().partition(" ")
        if (name.rstrip("*") in wanted) if wanted else name.endswith("*"):
            pool.update(expand_nodelist(nodelist.strip()))
    return pool


@dataclass(frozen=True)
class StartEstimate:
    """``sbatch --test-only``'s answer for one partition: when Slurm would start the job, or why not."""

    partition: str
    start: str | None  # an ISO time, None when the job cannot run there
    detail: str  # Slurm's own words (nodes and processors, or the reason)


def start_estimate(partition: str, options: list[str]) -> StartEstimate:
    """Ask Slurm when a job of these sbatch ``options`` would start in ``partition``, submitting nothing."""
    check_client()
    args = ["sbatch", "--test-only", f"--partition={partition}", *options, "--wrap", "true"]
    result = _client(args, 30)
    text = (result.stderr + result.stdout).strip()
    # "sbatch: Job 12 to start at 2026-11-21T10:00:00 using 4 processors on nodes node1 in partition debug"
    match = re.search(r"to start at (\S+) (using .*)", text)
    if result.returncode == 0 and match:
        return StartEstimate(partition, match.group(1), match.group(2))
    reason = text.splitlines()[-1] if text else f"exit {result.returncode}"
    return StartEstimate(partition, None, reason.removeprefix("sbatch: error: "))


# ------------------------------------------------------------------------------ from inside a running job
@dataclass(frozen=True)
class Outcome:
    """How a command run from inside the job ended (it does not raise on a non-zero exit)."""

    command: str  # as typed: "scontrol requeue 12_3"
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _in_job(args: list[str], timeout: float, attempts: int = 1, ignore_sigterm: bool = False) -> Outcome:
    """Run a client from inside the job, up to ``attempts`` times 0.5 s apart until it exits 0.

    ``ignore_sigterm``: the client ignores SIGTERM, as a requeue sends one to every process of the job
    (the client asking for the requeue included)."""

    def once() -> Outcome:
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_ignore_sigterm if ignore_sigterm else None,
        )
        return Outcome(" ".join(args), result.returncode, result.stdout, result.stderr)

    outcome = once()
    for _ in range(attempts - 1):
        if outcome.ok:
            break
        time.sleep(0.5)  # e.g. "no longer pending" while a requeue is still under way
        outcome = once()
    return outcome


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def was_cancelled(job_id: str) -> bool:
    """Did someone scancel the job? Then its SIGTERM is no pre-emption: requeueing would undo the cancel.

    Accounting shows "CANCELLED by <uid>" as soon as scancel runs, while a signal alone (pre-emption
    schemes, ``scancel --signal``) leaves the job RUNNING. Without accounting, a job Slurm is already ending
    (COMPLETING) is taken as cancelled: not requeueing a job is the safe mistake.
    """
    sacct = _in_job(["sacct", "--noheader", "--allocations", "--jobs", job_id, "--format", "State%40"], 30)
    if sacct.ok and sacct.stdout.strip():
        return sacct.stdout.split()[0] == "CANCELLED"
    show = _show_job_text(job_id)
    return "JobState=COMPLETING" in show or "JobState=CANCELLED" in show


def _show_job_text(job_id: str) -> str:
    """``scontrol show job``'s output from inside the job; empty when scontrol fails."""
    return _in_job(["scontrol", "show", "job", job_id], 30).stdout


def job_fields(job_id: str) -> dict[str, str]:
    """The job's ``scontrol show job`` fields (ExcNodeList, Partition, NumNodes, ...) from inside it; empty
    when scontrol fails. (:func:`show_job` is the login node's, which raises.)"""
    return _fields(_show_job_text(job_id))


def partition_nodes(partition: str) -> set[str]:
    """The host names of a partition's nodes (sinfo); empty when sinfo fails."""
    out = _in_job(["sinfo", "--noheader", "--partition", partition, "--format", "%N"], 30).stdout
    return {node for item in out.split() for node in expand_nodelist(item)}


def requeue(job_id: str, attempts: int = 1, ignore_sigterm: bool = False) -> Outcome:
    """``scontrol requeue``: the job goes back to the queue, its processes get SIGTERM. See :func:`_in_job`
    for ``attempts`` and ``ignore_sigterm``."""
    return _in_job(["scontrol", "requeue", job_id], 60, attempts, ignore_sigterm)


# cluster.time_min: the limit the job asked for, in minutes (its script exports it). Slurm (22.05) keeps the
# shorter limit backfill granted a --time-min job through a requeue, so every later start would be as short.
REQUESTED_TIME_ENV = "HPCTRAIN_REQUESTED_TIME"


def ask_requested_time(job_id: str, attempts: int = 1, ignore_sigterm: bool = False) -> Outcome | None:
    """After a requeue of a ``cluster.time_min`` job: its whole ``cluster.time`` asked for again, so the
    scheduler chooses anew between the two (``scontrol update TimeLimit``; raising a limit may take a Slurm
    operator at a site). None for any other job."""
    minutes = os.environ.get(REQUESTED_TIME_ENV, "")
    if not minutes.isdigit():
        return None
    return update_job(job_id, {"TimeLimit": minutes}, attempts, ignore_sigterm)


def update_job(
    job_id: str, fields: dict[str, str], attempts: int = 1, ignore_sigterm: bool = False
) -> Outcome:
    """``scontrol update JobId=<job_id> Key=Value...`` (e.g. ``{"ExcNodeList": "node3"}``: Slurm takes an
    exclusion only while the job is pending)."""
    args = ["scontrol", "update", f"JobId={job_id}", *(f"{key}={value}" for key, value in fields.items())]
    return _in_job(args, 60, attempts, ignore_sigterm)


EVAL_STEP_ENV = "HPCTRAIN_EVAL_STEP"  # trainer.eval_job: the step an evaluation job evaluates


def submit_dependent(script: Path, after_job: str, env: dict[str, str]) -> Outcome:
    """From inside a job: ``sbatch --parsable --dependency=after:<after_job> SCRIPT`` with ``env`` as the new
    job's environment (the caller leaves this job's SLURM_* out: sbatch would take them as its own)."""
    args = ["sbatch", "--parsable", f"--dependency=after:{after_job}", "--export=ALL", str(script)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    return Outcome(" ".join(args), result.returncode, result.stdout, result.stderr)


def end_time(job_id: str) -> float | None:
    """The job's end time as a Unix timestamp, from squeue; None when unknown (no limit, no Slurm)."""
    try:
        out = _in_job(["squeue", "--noheader", "--jobs", job_id, "--format", "%e"], 30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if not out.ok or len(lines) != 1:
        return None
    try:
        return datetime.fromisoformat(lines[0]).timestamp()  # squeue prints local time without a zone
    except ValueError:  # N/A, NONE, Unknown: no limit to guard
        return None
