"""A Hydra multirun on a Slurm cluster becomes ONE job array, and the command returns once it is queued.

hydra-submitit-launcher submits one job per member and then blocks until every job has ended (hydra issues
#2479, #692): a sweep ties up a login-node shell for days. Here every member's run directory and config are
prepared first (all validated before anything is submitted), then one ``sbatch --array`` goes out, and a
``sweep.json`` manifest lets ``hpctrain status | summary | cancel`` find the members later.

Sweepers that need results to choose the next trials (Optuna, Ax, ...) still work: for them the launcher
waits for its batch and returns each member's final validation loss (or loss) as the objective.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from hpctrain.config.compose import to_typed
from hpctrain.config.io import write_run_config
from hpctrain.config.redact import redact_files
from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import ConfigError
from hpctrain.plan.check import check_run
from hpctrain.rundir import SWEEP_RECORD, RunDir, RunLock
from hpctrain.rundir.records import SweepRecord, read_sweep, sweep_argv, write_json
from hpctrain.rundir.runs import finished
from hpctrain.slurm.commands import SiteLimits

log = logging.getLogger(__name__)


def launch_array(
    hydra_context: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[Any]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus

    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    members: list[tuple[Config, Path, list[str], DictConfig]] = []
    for offset, overrides in enumerate(job_overrides):
        index = initial_job_idx + offset
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = str(index)
            sweep_config.hydra.job.num = index
        HydraConfig.instance().set_config(sweep_config)
        typed = to_typed(sweep_config)
        check_run(typed)
        members.append(
            (typed, sweep_dir / str(sweep_config.hydra.sweep.subdir), list(overrides), sweep_config)
        )
    _check_one_shape([m[0] for m in members], [m[2] for m in members])

    first = members[0][0]
    # Hydra recorded the sweep's overrides, secret cluster.env values included, before calling us.
    redact_files([RunDir(sweep_dir).multirun], first.cluster.env)
    if first.dry_run:
        log.info(
            "Dry run: nothing submitted. A job array of %d members would run in %s:", len(members), sweep_dir
        )
        for _, run_dir, overrides, _ in members:
            log.info("  %s  %s", run_dir.name, " ".join(overrides) or "(no overrides)")
        return [_job_return(m[3], m[2], m[1], JobStatus.COMPLETED, None) for m in members]

    from hpctrain.launch.submitit import pack_groups, submit_array
    from hpctrain.slurm.commands import use_remote
    from hpctrain.slurm.remote import Remote

    # cluster.ssh: every Slurm command runs on the login node, and the arrays are sbatch scripts shipped
    # there (hpctrain.launch.sbatch.submit_sweep_over_ssh); submitit's would submit from here.
    remote = Remote(first.cluster.ssh, first.cluster.ssh_config) if first.cluster.ssh else None
    with use_remote(remote):
        limits = site_limits(len(pack_groups(len(members), first.cluster.pack)))  # before anything is written
        for _, run_dir, overrides, sweep_config in members:
            write_run_config(run_dir, sweep_config)
            RunDir(run_dir).write_hydra_overrides(overrides)

        ranks = run_shape(first).world_size
        run_dirs, member_overrides = [m[1] for m in members], [m[2] for m in members]
        if remote is not None:
            from hpctrain.launch.sbatch import submit_sweep_over_ssh

            record = submit_sweep_over_ssh(
                first, run_dirs, member_overrides, sweep_dir, ranks, limits.max_array_size
            )
        else:
            record = submit_array(
                first.cluster, run_dirs, member_overrides, sweep_dir, ranks, limits.max_array_size, first
            )
    previous = read_sweep(sweep_dir)  # a sweeper that launches in batches adds to the same manifest
    # The sweep's own command: what a command reusing the directory must match (hpctrain.submit.existing).
    record.command = previous.command if previous is not None else sweep_argv(sys.argv[1:])
    if previous is not None:
        record.members = previous.members + record.members
        record.array_job_ids = previous.arrays + record.arrays
        record.array_job_id = previous.array_job_id
    write_json(RunDir(sweep_dir).sweep, record)
    _print_submitted(record, sweep_dir, len(members), first.cluster, limits)

    results: dict[str, float | None] = {}
    if not _is_basic_sweeper(config):
        results = wait_for_objectives(
            [m.job_id for m in record.members[-len(members) :]], [m[1] for m in members]
        )
    returns = []
    for member, (_, run_dir, overrides, sweep_config) in zip(
        record.members[-len(members) :], members, strict=True
    ):
        value: Any = results.get(member.job_id, member.job_id)
        status = JobStatus.FAILED if results and value is None else JobStatus.COMPLETED
        if status is JobStatus.FAILED:
            value = RuntimeError(f"sweep member {member.index} (job {member.job_id}) did not finish")
        returns.append(_job_return(sweep_config, overrides, run_dir, status, value))
    return returns


def site_limits(jobs: int) -> SiteLimits:
    """The site's MaxArraySize (a larger sweep becomes several arrays) and the user's job limit, which a
    sweep of ``jobs`` jobs must fit: refused in one line before anything is written or submitted."""
    from hpctrain.slurm.commands import SlurmUnavailable
    from hpctrain.slurm.commands import site_limits as query

    try:
        limits = query()
    except (SlurmUnavailable, RuntimeError, OSError) as err:
        raise ConfigError("cluster", "slurm", f"cannot read the site's limits: {err}") from None
    if limits.max_submit_jobs is not None and jobs > limits.max_submit_jobs:
        raise ConfigError(
            "hydra.sweeper",
            f"{jobs} jobs",
            f"your association allows {limits.max_submit_jobs} submitted jobs (MaxSubmitJobs), and an "
            "array of N members counts N",
            valid=f"at most {limits.max_submit_jobs} jobs: fewer members, or cluster.pack to run several "
            "per job",
        )
    return limits


def _check_one_shape(configs: list[Config], overrides: list[list[str]]) -> None:
    """A job array has one resource shape: members may differ in anything but the cluster profile."""
    for typed, member_overrides in zip(configs[1:], overrides[1:], strict=True):
        if typed.cluster != configs[0].cluster or typed.launcher != configs[0].launcher:
            differing = [
                k for k in vars(typed.cluster) if getattr(typed.cluster, k) != getattr(configs[0].cluster, k)
            ]
            key = f"cluster.{differing[0]}" if differing else "launcher"
            raise ConfigError(
                key,
                " ".join(member_overrides),
                "sweep members differ in their cluster settings, but one job array has one shape",
                valid="sweep the cluster settings as separate multiruns",
            )


def _is_basic_sweeper(config: DictConfig) -> bool:
    return "BasicSweeper" in str(config.hydra.sweeper.get("_target_", "BasicSweeper"))


def wait_for_objectives(job_ids: list[str], run_dirs: list[Path]) -> dict[str, float | None]:
    """Block until the jobs end; each one's final val_loss (else loss), or None if it did not complete.

    A member that wrote its last step and let go of its run's lock is done (its directory says so, each
    second); Slurm is asked only about the others, and through the user's shared watch
    (:mod:`hpctrain.slurm.watch`): one squeue of all the user's jobs per interval, not one per member."""
    from hpctrain.slurm.watch import INTERVAL_S, watched_states

    log.info("Waiting for %d sweep members (the sweeper needs their results)", len(job_ids))
    ended: dict[str, str] = {}
    next_ask = 0.0
    while len(ended) < len(job_ids):
        for job_id, run_dir in zip(job_ids, run_dirs, strict=True):
            if job_id not in ended and _ended_here(run_dir):
                ended[job_id] = "COMPLETED"
        waiting = [j for j in job_ids if j not in ended]
        if waiting and time.monotonic() >= next_ask:
            next_ask = time.monotonic() + INTERVAL_S
            states = watched_states(waiting)
            ended.update({j: states[j].state for j in waiting if j in states and states[j].final})
        if len(ended) < len(job_ids):
            time.sleep(1.0)
    results: dict[str, float | None] = {}
    for job_id, run_dir in zip(job_ids, run_dirs, strict=True):
        done = ended[job_id] == "COMPLETED" or _ended_here(run_dir)
        results[job_id] = final_objective(run_dir) if done else None
    return results


def _ended_here(run_dir: Path) -> bool:
    """Whether a member's directory says it is done: its last step written, its lock let go."""
    return finished(run_dir) and not RunLock(run_dir).is_held()


def final_objective(run_dir: Path) -> float | None:
    """A run's final val_loss (else loss): what a sweeper such as Optuna minimises."""
    records = RunDir(run_dir).read_metrics()  # a torn last line (a crash mid-write) is skipped
    if not records:
        return None
    last = records[-1]
    value = last["val_loss"] if "val_loss" in last else last.get("loss")
    # metrics.jsonl writes a number that is not finite as null (hpctrain.observe.loggers): NaN to the sweeper.
    return float("nan") if value is None else float(value)


def _job_return(
    sweep_config: DictConfig, overrides: list[str], run_dir: Path, status: Any, value: Any
) -> Any:
    from hydra.core.utils import JobReturn

    job_return = JobReturn()
    job_return.overrides = overrides
    job_return.cfg = sweep_config
    job_return.hydra_cfg = sweep_config
    job_return.working_dir = str(run_dir)
    job_return.task_name = str(sweep_config.hydra.job.name)
    job_return.status = status
    job_return._return_value = value
    return job_return


def _print_submitted(
    record: SweepRecord, sweep_dir: Path, count: int, cluster: ClusterConfig, limits: SiteLimits
) -> None:
    arrays = record.arrays
    jobs = len({m.job_id for m in record.members[-count:]})
    packed = f" in {jobs} jobs of up to {cluster.pack} (cluster.pack)" if cluster.pack > 1 else ""
    if len(arrays) == 1:
        log.info(
            "Submitted job array %s: %d member%s%s, at most %d running at once",
            arrays[0],
            count,
            "s" * (count > 1),
            packed,
            cluster.array_parallelism,
        )
    else:
        log.info(
            "Submitted %d job arrays %s (MaxArraySize=%d): %d members%s, at most %d running per array",
            len(arrays),
            ", ".join(arrays),
            limits.max_array_size,
            count,
            packed,
            cluster.array_parallelism,
        )
    log.info("  sweep directory  %s (manifest: %s)", sweep_dir, SWEEP_RECORD)
    for member in record.members[-count:]:
        log.info("  %-10s %s  %s", member.job_id, Path(member.run_dir).name, " ".join(member.overrides))
    log.info(
        "  follow it        hpctrain status %s   |   hpctrain summary %s   |   hpctrain cancel %s",
        sweep_dir,
        sweep_dir,
        sweep_dir,
    )
