"""What a TARGET argument names: a run directory (``job.json``; a local run has none), a sweep directory
(``sweep.json``) or a Slurm job id (``123``, or ``123_4`` for one array member), whose run or sweep directory
is found from the job's output path while slurmctld still knows the job. No torch import here.

A run submitted from a laptop (``cluster.ssh``: its ``job.json`` here names the login node) lives on the
cluster: :func:`forward` runs the command there, with the run's own code snapshot (``hpctrain.sh``), over the
same ssh connection as every Slurm command. One round trip instead of one per file, the files read by the
hpctrain version that wrote them, and ``logs -f`` streams as it does on the login node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.rundir import JOB_RECORD, METRICS_FILE, SWEEP_RECORD, RunDir
from hpctrain.rundir.records import JobRecord, SweepMember, SweepRecord, read_job, read_sweep
from hpctrain.slurm import commands, watch
from hpctrain.slurm.commands import JOB_ID, JobState, SlurmUnavailable
from hpctrain.slurm.remote import Remote, RemoteError


class JobsError(Exception):
    """A target that cannot be found or read, or a Slurm query that failed: one line, exit status 1."""


TARGET_HELP = "a run directory, a sweep directory or a Slurm job id"  # the TARGET argument's --help

# ---------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    """What a TARGET argument names. ``run_dir`` is None for a job id whose directory was not found."""

    text: str
    run_dir: Path | None = None
    job: JobRecord | None = None  # None for a local run
    sweep: SweepRecord | None = None
    sweep_dir: Path | None = None
    job_id: str | None = None  # a bare job id, when no directory is known
    remote: Remote | None = None  # submitted from here over cluster.ssh: the cluster's login node
    remote_dir: str | None = None  # and the run directory there

    @property
    def is_sweep(self) -> bool:
        return self.sweep is not None

    @property
    def slurm_id(self) -> str | None:
        return self.job.job_id if self.job is not None else self.job_id


def resolve(text: str | None) -> Target:
    """What TARGET names; without one, the run of ./outputs or ./multirun that changed last."""
    if text is None:
        from hpctrain.errors import ConfigError
        from hpctrain.rundir.runs import latest_run

        try:
            latest = latest_run(Path.cwd())
        except ConfigError as err:
            raise JobsError(f"no TARGET given and {err.reason}: give a run directory") from None
        return _resolve_dir(str(latest), latest)
    path = Path(text).expanduser()
    if path.is_file() and path.name in (JOB_RECORD, SWEEP_RECORD):
        path = path.parent
    if path.is_dir():
        return _resolve_dir(text, path.absolute())
    if JOB_ID.fullmatch(text):
        return _resolve_job_id(text)
    raise JobsError(f"{text}: no such run directory, sweep directory or Slurm job id")


def _resolve_dir(text: str, path: Path) -> Target:
    try:
        sweep = read_sweep(path)
        if sweep is not None and sweep.ssh is not None:  # submitted from here over cluster.ssh
            remote = Remote(sweep.ssh, sweep.ssh_config)
            there = sweep.remote_sweep_dir or str(path)
            return Target(text, sweep=sweep, sweep_dir=path, remote=remote, remote_dir=there)
        if sweep is not None and sweep.array_job_id == LOCAL:
            return Target(text, sweep=_with_unlisted(sweep, local_sweep(path)), sweep_dir=path)
        if sweep is not None:
            return Target(text, sweep=sweep, sweep_dir=path)
        job = read_job(path)
    except (ValueError, TypeError, KeyError) as err:
        raise JobsError(f"{text}: unreadable record ({err})") from None
    if job is not None and job.ssh is not None:
        remote = Remote(job.ssh, job.ssh_config)
        return Target(text, run_dir=path, job=job, remote=remote, remote_dir=job.remote_run_dir or str(path))
    if job is not None:
        return Target(text, run_dir=path, job=job)
    if RunDir(path).multirun.is_file() or _numbered_runs(path):
        return Target(text, sweep=local_sweep(path), sweep_dir=path)
    if RunDir(path).config.is_file() or RunDir(path).metrics.is_file():
        return Target(text, run_dir=path)  # a local run
    raise JobsError(
        f"{text}: not a run or sweep directory (no {JOB_RECORD}, {SWEEP_RECORD} or {METRICS_FILE})"
    )


LOCAL = "local"  # the "array job id" and cluster of a sweep run here


def _numbered_runs(path: Path) -> list[Path]:
    """The member run directories of a sweep run here: numbered folders holding a run's config (Hydra's
    basic sweeper writes multirun.yaml beside them, the Optuna sweeper optimization_results.yaml)."""
    found = [p for p in path.iterdir() if p.is_dir() and p.name.isdigit() and RunDir(p).config.is_file()]
    return sorted(found, key=lambda p: int(p.name))


def local_sweep(path: Path) -> SweepRecord:
    """A sweep run here (``-m`` with cluster=local): its members are the numbered run directories Hydra made,
    their overrides those Hydra recorded in each member's .hydra/overrides.yaml."""
    members = []
    for folder in sorted(
        (p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    ):
        overrides = RunDir(folder).read_hydra_overrides() or []
        members.append(SweepMember(int(folder.name), overrides, str(folder), f"{LOCAL}:{folder.name}"))
    return SweepRecord(array_job_id=LOCAL, cluster=LOCAL, members=members)


def _with_unlisted(record: SweepRecord, found: SweepRecord) -> SweepRecord:
    """A sweep run here as its sweep.json lists it, and any member run beside it that the record does not
    list (started by a version that wrote none, or put there by hand): its folders are Hydra's own record."""
    listed = {Path(m.run_dir).name for m in record.members}
    record.members += [m for m in found.members if Path(m.run_dir).name not in listed]
    return record


def local_states(sweep: SweepRecord) -> dict[str, JobState]:
    """What a local sweep's members are doing, from their run directories (:mod:`hpctrain.jobs.states`)."""
    from hpctrain.jobs.states import run_state

    states = {}
    for member in sweep.members:
        word = run_state(Path(member.run_dir)).word
        states[member.job_id] = JobState(member.job_id, word, "", "localhost", "")
    return states


def _resolve_job_id(job_id: str) -> Target:
    states = states_of([job_id])
    if job_id not in states and not _array_members(job_id, states):
        raise JobsError(f"{job_id}: unknown Slurm job id")
    found = _directory_of_job(job_id)
    return found if found is not None else Target(job_id, job_id=job_id)


def _directory_of_job(job_id: str) -> Target | None:
    """The run or sweep directory of a job, from where submitit or an sbatch script writes its output."""
    try:
        fields = commands.show_job(job_id) or {}
    except RuntimeError:
        return None
    array = job_id.split("_")[0]
    seen: set[Path] = set()
    for key in ("StdOut", "Command", "WorkDir"):
        value = fields.get(key, "")
        if not value.startswith("/"):
            continue
        for parent in list(Path(value).parents)[:4]:
            if parent in seen or parent == Path("/"):
                continue
            seen.add(parent)
            try:
                job = read_job(parent)
                sweep = read_sweep(parent)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if job is not None and job.job_id == job_id:
                return Target(job_id, run_dir=parent, job=job)
            if sweep is not None:
                if job_id in sweep.arrays:
                    return Target(job_id, sweep=sweep, sweep_dir=parent)
                member = next((m for m in sweep.members if m.job_id == job_id), None)
                if member is not None:
                    return member_target(job_id, member)
                if array in sweep.arrays:
                    return Target(job_id, sweep=sweep, sweep_dir=parent)
    return None


def member_target(text: str, member: SweepMember) -> Target:
    run_dir = Path(member.run_dir)
    try:
        job = read_job(run_dir)
    except (ValueError, TypeError, KeyError):
        job = None
    if job is None:  # the member's job.json is missing: its id is in the sweep's record
        job = JobRecord(member.job_id, "", "", 0, 0, "")
    return Target(text, run_dir=run_dir, job=job)


def _array_members(array_id: str, states: dict[str, JobState]) -> list[JobState]:
    """The members of job array ``array_id`` among ``states`` (Slurm answers for an array id with those)."""
    return [s for job, s in states.items() if job.startswith(f"{array_id}_")]


def state_of(job_id: str, watched: bool = False) -> tuple[JobState | None, list[JobState]]:
    """A job's state; for a job array's id, one state standing for all its members, and the members.
    ``watched``: as of at most :data:`hpctrain.slurm.watch.INTERVAL_S` ago, for a loop that waits on it."""
    states = states_of([job_id], watched)
    if job_id in states:
        return states[job_id], []
    members = _array_members(job_id, states)
    if not members:
        return None, []
    words = [m.state for m in members]
    active = [w for w in words if w not in commands.FINAL_STATES]
    if active:
        word = "RUNNING" if "RUNNING" in active else active[0]
    else:
        word = next((w for w in words if w != "COMPLETED"), "COMPLETED")
    return JobState(job_id, word, "", "", ""), members


def states_of(job_ids: list[str], watched: bool = False) -> dict[str, JobState]:
    try:
        return watch.watched_states(job_ids) if watched else commands.job_states(job_ids)
    except SlurmUnavailable as err:
        raise JobsError(str(err)) from None
    except (RuntimeError, OSError, ValueError) as err:  # a client that failed or timed out
        raise JobsError(f"cannot query Slurm: {err}") from None


def remote_target(text: str) -> Target | None:
    """The run or sweep directory ``text`` when it was submitted from here over ``cluster.ssh`` (its record
    names the login node), else None: ``save``, ``stop`` and ``report`` then run on the cluster."""
    path = Path(text).expanduser()
    if not path.is_dir():
        return None
    try:
        target = _resolve_dir(text, path.absolute())
    except JobsError:
        return None
    return target if target.remote is not None else None


def forward(target: Target, command: str, options: list[str]) -> int:
    """``hpctrain COMMAND <run dir there> OPTIONS`` on the cluster for a run submitted over cluster.ssh,
    its output streamed here; its exit status (JobsError when ssh fails: one line naming the host)."""
    assert target.remote is not None and target.remote_dir is not None
    script = str(RunDir(Path(target.remote_dir)).remote_cli)
    try:
        return target.remote.forward(["bash", script, command, target.remote_dir, *options])
    except RemoteError as err:
        raise JobsError(str(err)) from None
