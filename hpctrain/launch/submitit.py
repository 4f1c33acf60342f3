"""``cluster.kind=slurm`` through submitit: one multi-node job per run, one job array per sweep.

Submission returns as soon as Slurm has queued the job. The job runs the package as it was at submit time
(a snapshot under the run or sweep directory), with ``nodes × tasks_per_node`` tasks that each become one
rank (:func:`hpctrain.launch.submitit_task.run_task`). No torch import on this path: it runs on login nodes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hpctrain.config.redact import export_secrets
from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError
from hpctrain.launch.avoid import job_exclude
from hpctrain.launch.jobscript import (
    allocation_nodes,
    container_srun_args,
    setup_lines,
    survives_lost_nodes,
)
from hpctrain.launch.project import project_dir
from hpctrain.launch.snapshot import (
    ProjectSnapshot,
    plan_project,
    project_path_entry,
    snapshot_package,
    snapshot_project,
)
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import JobRecord, SweepMember, SweepRecord, write_json
from hpctrain.slurm.commands import check_client
from hpctrain.slurm.spec import parse_time_limit

log = logging.getLogger(__name__)


def submitit_parameters(
    cluster: ClusterConfig, snapshot: Path, project: Path | None = None, submit_dir: Path | None = None
) -> dict[str, Any]:
    """``project``: the user's project copy in the snapshot; ``submit_dir``: where the run was submitted."""
    params: dict[str, Any] = {
        "job_name": cluster.job_name,
        "partition": cluster.partition,
        "account": cluster.account,
        "qos": cluster.qos,
        "time": parse_time_limit(cluster.time),
        "nodes": allocation_nodes(cluster),
        "ntasks_per_node": cluster.tasks_per_node,
        "cpus_per_task": cluster.cpus_per_task,
        "gpus_per_node": cluster.gpus_per_node or None,
        "mem": cluster.mem,
        "constraint": cluster.constraint,
        "exclude": job_exclude(cluster),
        "signal_delay_s": cluster.signal_lead_s,
        "setup": setup_lines(cluster, snapshot, project, submit_dir),
        "srun_args": container_srun_args(cluster) or None,
        "array_parallelism": cluster.array_parallelism,
        "stderr_to_stdout": True,
        "exclusive": True if cluster.exclusive else None,
        "gres": cluster.gres,
        "gpus_per_task": cluster.gpus_per_task,
        "mail_user": cluster.mail_user,
        "mail_type": cluster.mail_type,
        "dependency": cluster.dependency,
        "additional_parameters": sbatch_extras(cluster),
    }
    return {k: v for k, v in params.items() if v is not None}


def sbatch_extras(cluster: ClusterConfig) -> dict[str, Any]:
    """The sbatch options without a submitit parameter of their own: requeue, the warning signal (submitit
    writes USR2 otherwise), the reservation and ``cluster.additional`` (a flag when true, left out when
    false)."""
    extras: dict[str, Any] = {
        # Requeueable even where JobRequeue=0: on pre-emption the job requeues itself (hpctrain.resilience).
        "requeue": True,
        "signal": f"{cluster.signal}@{cluster.signal_lead_s}",
    }
    if survives_lost_nodes(cluster):  # a node's failure does not end the job (hpctrain.launch.agent)
        extras["no-kill"] = True
    if cluster.reservation is not None:
        extras["reservation"] = cluster.reservation
    if cluster.time_min is not None:  # submitit has no parameter of its own for it
        extras["time-min"] = parse_time_limit(cluster.time_min)
    for name, value in cluster.additional.items():
        if value is not None and value is not False:
            extras[str(name).replace("_", "-")] = value
    return extras


def _executor(cluster: ClusterConfig, folder: Path, root: Path, plan: ProjectSnapshot | None) -> Any:
    import submitit

    # In a container the image's python runs the job (the login node's venv is not inside it).
    executor = submitit.SlurmExecutor(
        folder=folder / "%j", python="python3" if cluster.container_image else None
    )
    params = submitit_parameters(cluster, RunDir(root).code, project_path_entry(plan, root), project_dir())
    executor.update_parameters(**params)
    return executor


def take_snapshot(cluster: ClusterConfig, root: Path) -> ProjectSnapshot | None:
    """Copy hpctrain and the user's project under ``root/code``; return the project's plan. ConfigError:
    the project snapshot is refused (see :func:`hpctrain.launch.snapshot.plan_project`); nothing is copied."""
    plan = plan_project(project_dir(), cluster.snapshot_paths)
    snapshot_package(root)
    snapshot_project(plan, root)
    return plan


def _private(job: Any) -> None:
    """submitit's job script, readable by its owner only (0700)."""
    with contextlib.suppress(AttributeError, OSError):
        Path(job.paths.submission_file).chmod(0o700)


class SubmititLauncher:
    def launch(self, cfg: Config, run_dir: Path) -> int:
        snapshot = RunDir(run_dir).code
        try:
            if cfg.dry_run:
                plan = plan_project(project_dir(), cfg.cluster.snapshot_paths)
                params = submitit_parameters(
                    cfg.cluster, snapshot, project_path_entry(plan, run_dir), project_dir()
                )
                print_dry_run(cfg, run_dir, params)
                return 0
            check_client()
            plan = take_snapshot(cfg.cluster, run_dir)
        except ConfigError as err:
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        export_secrets(cfg.cluster.env)  # submitit's sbatch propagates the submitter's environment to the job
        from hpctrain.launch.eval_job import write_eval_script
        from hpctrain.launch.submitit_task import run_task

        write_eval_script(cfg, run_dir, run_dir)

        job = _executor(cfg.cluster, RunDir(run_dir).slurm, run_dir, plan).submit(run_task, str(run_dir))
        _private(job)
        output = str(RunDir(run_dir).slurm / "%j" / "%j_%t_log.out")
        c, ranks = cfg.cluster, run_shape(cfg).world_size
        record = JobRecord(job.job_id, "submitit", c.name, c.nodes, c.tasks_per_node, output, ranks)
        write_json(RunDir(run_dir).job, record)
        print_submitted(record, run_dir)
        return 0


def submit_array(
    cluster: ClusterConfig,
    run_dirs: list[Path],
    overrides: list[list[str]],
    sweep_dir: Path,
    ranks: int,
    max_array_size: int,
    first: Config | None = None,
) -> SweepRecord:
    """Submit the sweep whose member i trains the run prepared in ``run_dirs[i]`` on ``ranks`` ranks (the
    members' world size: one array has one size) as job arrays of at most ``max_array_size`` jobs (the
    site's MaxArraySize), under one record. With ``cluster.pack=N`` each job runs N members one after another
    (:func:`hpctrain.launch.submitit_task.run_pack`). ``first``: the first member's config (its
    ``trainer.eval_job`` writes every member's evaluation script)."""
    check_client()
    export_secrets(cluster.env)
    plan = take_snapshot(cluster, sweep_dir)
    from hpctrain.launch.submitit_task import run_pack, run_task

    if first is not None:  # trainer.eval_job: every member's evaluation script
        from hpctrain.launch.eval_job import write_eval_script

        for run_dir in run_dirs:
            write_eval_script(first, run_dir, sweep_dir)
    executor = _executor(cluster, RunDir(sweep_dir).slurm, sweep_dir, plan)
    groups = pack_groups(len(run_dirs), cluster.pack)
    jobs: list[Any] = []
    arrays: list[str] = []
    for start in range(0, len(groups), max_array_size):
        with executor.batch():
            batch = [
                executor.submit(run_pack, [str(run_dirs[i]) for i in group])
                if cluster.pack > 1
                else executor.submit(run_task, str(run_dirs[group[0]]))
                for group in groups[start : start + max_array_size]
            ]
        for job in batch:
            _private(job)
        jobs += batch
        arrays.append(batch[0].job_id.split("_")[0])
    members = []
    output = str(RunDir(sweep_dir).slurm / "%j" / "%j_%t_log.out")
    for pack, (job, group) in enumerate(zip(jobs, groups, strict=True)):
        for index in group:
            record = JobRecord(
                job.job_id, "submitit", cluster.name, cluster.nodes, cluster.tasks_per_node, output, ranks
            )
            write_json(RunDir(run_dirs[index]).job, record)
            packed = pack if cluster.pack > 1 else None
            members.append(SweepMember(index, overrides[index], str(run_dirs[index]), job.job_id, packed))
    return SweepRecord(arrays[0], cluster.name, members, array_job_ids=arrays)


def pack_groups(members: int, pack: int) -> list[list[int]]:
    """Member indices per job: ``pack`` consecutive members each (the last job may hold fewer)."""
    return [list(range(i, min(i + pack, members))) for i in range(0, members, pack)]


def print_submitted(record: JobRecord, run_dir: Path) -> None:
    ranks = record.ranks
    log.info(
        "Submitted Slurm job %s (%d node%s × %d task%s = %d ranks, %s)",
        record.job_id,
        record.nodes,
        "s" * (record.nodes > 1),
        record.tasks_per_node,
        "s" * (record.tasks_per_node > 1),
        ranks,
        record.launcher,
    )
    log.info("  run directory  %s", run_dir)
    log.info("  rank 0 log     %s", RunDir(run_dir).log(0))
    log.info("  Slurm output   %s", record.slurm_output.replace("%j", record.job_id))
    log.info(
        "  follow it      hpctrain status %s   |   hpctrain logs %s -f   |   hpctrain cancel %s",
        run_dir,
        run_dir,
        run_dir,
    )


def print_dry_run(cfg: Config, run_dir: Path, parameters: dict[str, Any] | str) -> None:
    c, shape = cfg.cluster, run_shape(cfg)
    log.info("Dry run: nothing submitted.")
    log.info(
        "Plan: %d node%s%s × %d task%s = %d ranks (%s), %s, time limit %s, partition %s",
        c.nodes,
        "s" * (c.nodes > 1),
        f" (+ {c.spare_nodes} spare{'s' * (c.spare_nodes > 1)}, waiting)" if c.spare_nodes else "",
        c.tasks_per_node,
        "s" * (c.tasks_per_node > 1),
        shape.world_size,
        f"{c.gpus_per_node} GPUs per node" if c.gpus_per_node else "CPU",
        f"parallel={cfg.parallel.name} ({shape.degrees})",
        c.time if c.time_min is None else f"{c.time} (at least {c.time_min}: backfill may grant less)",
        c.partition or "(default)",
    )
    from hpctrain.plan.rehearsal import rehearsal_line

    log.info("%s", rehearsal_line(cfg))
    log.info("Run directory (made on submission: a dry run writes nothing): %s", run_dir)
    from hpctrain.launch.queue import start_estimates

    for line in start_estimates(c):  # sbatch --test-only per partition: nothing is submitted
        log.info("%s", line)
    if isinstance(parameters, str):
        log.info("sbatch script (as submission would write it):\n%s", parameters)
    else:
        log.info("submitit parameters:\n%s", json.dumps(parameters, indent=1))
