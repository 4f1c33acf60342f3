"""``launcher=sbatch``: render an sbatch script from the composed config, write it, submit it with sbatch.

The script is ``<run dir>/job.sbatch``, rendered from ``hpctrain/sbatch_templates/<cluster.sbatch_template>
.sbatch.j2``: ``srun`` (one Slurm task per rank) or ``torchrun`` (one task per node, torchrun starts the
ranks). It is a plain file a person can read, edit and submit again. ``dry_run=true`` prints it
and writes and submits nothing. No torch import on this path: it runs on login nodes.

Every config value that reaches the script was validated (:func:`hpctrain.config.validate._check_cluster`)
or is quoted here or in the template (the ``quote`` filter is :func:`shlex.quote`).

``cluster.ssh`` (submit from a laptop; ``launcher=auto`` picks this launcher then): the run directory is
prepared here as always, its script rendered for the run directory's place on the cluster
(:func:`hpctrain.slurm.remote.remote_run_dir`), then the whole directory (config, script, code snapshot) is
shipped to the login node and sbatch runs there, all over one ssh connection. The job runs the cluster's
``python`` (as ``cluster.setup`` sets it up) in the project's snapshot, or in the run directory when the
project is hpctrain itself. ``hpctrain.sh`` beside the script runs hpctrain's commands on the run there.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

import jinja2

from hpctrain.config.redact import export_secrets, secret_env
from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError
from hpctrain.launch.avoid import job_exclude
from hpctrain.launch.jobscript import allocation_nodes, container_srun_args, setup_lines
from hpctrain.launch.project import project_dir
from hpctrain.launch.snapshot import plan_project, project_path_entry
from hpctrain.launch.submitit import print_dry_run, print_submitted, take_snapshot
from hpctrain.plan.check import check_run
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import JobRecord, SweepMember, SweepRecord, write_json
from hpctrain.slurm.commands import SlurmUnavailable, check_client, submit_script, use_remote
from hpctrain.slurm.remote import Remote, RemoteError, remote_run_dir

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "sbatch_templates"


def template_path(name: str) -> Path:
    return TEMPLATE_DIR / f"{name}.sbatch.j2"


def slurm_output(run_dir: Path) -> str:
    """Where the job's stdout/stderr go: ``<run dir>/slurm/%j.out`` (Slurm puts the job id for ``%j``)."""
    return str(RunDir(run_dir).slurm / "%j.out")


def render_script(
    cfg: Config, run_dir: Path, submit_dir: Path | None = None, members: list[Path] | None = None
) -> str:
    """The sbatch script for the run in ``run_dir``, from ``cluster.sbatch_template``.

    Validates ``cfg`` first (ConfigError): the templates rely on the checks for what they do not quote. The
    user's project copy (:func:`hpctrain.launch.snapshot.plan_project`) follows the package on PYTHONPATH.
    ``submit_dir``: the job's working directory, HPCTRAIN_PROJECT_DIR (default: the one submitting here).
    ``members``: a job array (a sweep over cluster.ssh) whose task i trains the run in ``members[i]``;
    ``run_dir`` is then the sweep directory (its code snapshot, its slurm/ output folder).
    """
    check_run(cfg)
    c = cfg.cluster
    run_dir = run_dir.absolute()
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in str(run_dir)):
        # A newline would end an #SBATCH line or a comment early and start a shell line of its own.
        raise ConfigError("hydra.run.dir", str(run_dir), "contains a control character (newline, tab, ...)")
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # a shell script, not HTML: quoting is explicit, with the quote filter
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters["quote"] = lambda value: shlex.quote(str(value))
    template = environment.get_template(template_path(c.sbatch_template).name)
    # In a container the image's python runs the job, over ssh the cluster's; otherwise the submitting
    # interpreter, as with submitit.
    python = "python" if c.container_image or c.ssh else sys.executable
    # Slurm expands %-patterns in --output: a literal % in the run directory is written %%.
    output = str(RunDir(run_dir).slurm).replace("%", "%%") + "/%j.out"
    extra = _extra_options(c)
    array_lines: list[str] = []
    run_target = shlex.quote(str(run_dir))
    config_where, script_where = f"{run_target}/config.yaml", str(RunDir(Path(run_target)).sbatch_script)
    if members is not None:
        for member in members:
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in str(member)):
                raise ConfigError("hydra.sweep.dir", str(member), "contains a control character")
        # %A_%a: the array's id and the task's index, which hpctrain names a member's job by (123_4).
        output = str(RunDir(run_dir).slurm).replace("%", "%%") + "/%A_%a.out"
        extra.append(f"--array=0-{len(members) - 1}%{c.array_parallelism}")
        array_lines = [
            "# A job array: task i trains the sweep member whose run directory is the i-th of RUN_DIRS.",
            f"RUN_DIRS=({' '.join(shlex.quote(str(m)) for m in members)})",
            'RUN_DIR="${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}"',
        ]
        run_target = '"$RUN_DIR"'
        config_where = "its member's run directory (RUN_DIRS below), config.yaml"
        script_where = "the sweep's array-K.sbatch (this file)"
    return template.render(
        run_dir=str(run_dir),
        job_name=c.job_name,
        partition=c.partition,
        account=c.account,
        qos=c.qos,
        time=c.time.strip(),
        nodes=allocation_nodes(c),
        tasks_per_node=c.tasks_per_node,
        max_restarts=c.max_restarts,
        cpus_per_task=c.cpus_per_task,
        gpus_per_node=c.gpus_per_node,
        mem=c.mem,
        constraint=c.constraint,
        exclude=job_exclude(c),
        signal=c.signal,
        signal_lead_s=c.signal_lead_s,
        output=output,
        setup_lines=setup_lines(
            c,
            RunDir(run_dir).code,
            project_path_entry(plan_project(project_dir(), c.snapshot_paths), run_dir),
            submit_dir or project_dir(),
        ),
        srun_args=container_srun_args(c),
        python=python,
        extra_options=extra,
        array_lines=array_lines,
        run_target=run_target,
        config_where=config_where,
        script_where=script_where,
    )


def _extra_options(c: ClusterConfig) -> list[str]:
    """``--name=value`` / ``--flag`` for the sbatch options beyond the template's fixed lines (validated)."""
    from hpctrain.launch.submitit import sbatch_extras

    options = {
        "exclusive": True if c.exclusive else None,
        "gres": c.gres,
        "gpus-per-task": c.gpus_per_task,
        "mail-user": c.mail_user,
        "mail-type": c.mail_type,
        "dependency": c.dependency,
    }
    extras = {k: v for k, v in sbatch_extras(c).items() if k not in ("requeue", "signal")}
    return [
        f"--{name}" if value is True else f"--{name}={value}"
        for name, value in {**options, **extras}.items()
        if value is not None
    ]


def submit_sweep_over_ssh(
    first: Config,
    run_dirs: list[Path],
    overrides: list[list[str]],
    sweep_dir: Path,
    ranks: int,
    max_array_size: int,
) -> SweepRecord:
    """A sweep from a laptop (``cluster.ssh``; call it inside :func:`use_remote`): its members' directories
    are prepared here (config.yaml), the sweep's code snapshot taken and the array scripts rendered for the
    sweep directory's place on the cluster, the whole directory shipped, then one ``sbatch`` per job array
    (the site's MaxArraySize splits) there. The cluster's copies get a login node's records; the ones here
    (returned: the sweep's) name the login node, so that ``status``, ``summary``, ``cancel`` and ``report``
    of the sweep, and of each member, run there. ConfigError: refused before anything was shipped."""
    c = first.cluster
    assert c.ssh is not None
    remote = Remote(c.ssh, c.ssh_config)
    secrets = sorted(secret_env(c.env))
    if secrets:  # as for a single run: sbatch's environment over ssh is the login node's
        raise ConfigError(
            f"cluster.env.{secrets[0]}",
            "(secret, not shown)",
            "a secret reaches the job from "
            "the environment sbatch runs in; over cluster.ssh, the login node's",
            valid="set it in the login node's environment, not in cluster.env",
        )
    job_sweep = Path(remote_run_dir(sweep_dir, c.remote_dir, project_dir()))
    job_dirs = [job_sweep / d.relative_to(sweep_dir) for d in run_dirs]
    workdir = _remote_workdir(first, job_sweep)
    chunks = [
        list(range(i, min(i + max_array_size, len(run_dirs))))
        for i in range(0, len(run_dirs), max_array_size)
    ]
    scripts = [render_script(first, job_sweep, workdir, [job_dirs[i] for i in chunk]) for chunk in chunks]
    take_snapshot(c, sweep_dir)
    RunDir(sweep_dir).slurm.mkdir(parents=True, exist_ok=True)  # Slurm does not create --output's folder
    for k, script in enumerate(scripts):
        _write_private(RunDir(sweep_dir).array_script(k), script)
    cli_script = remote_cli_script(first, job_sweep, workdir)  # the sweep's snapshot serves each member
    for folder in (sweep_dir, *run_dirs):
        _write_private(RunDir(folder).remote_cli, cli_script)
    ship_run(remote, sweep_dir, job_sweep)
    arrays = [submit_script(RunDir(job_sweep).array_script(k), workdir) for k in range(len(chunks))]
    output = str(RunDir(job_sweep).slurm / "%j.out")  # %j: the member's job, ARRAY_TASK (Slurm's %A_%a)
    members, there = [], []
    for array, chunk in zip(arrays, chunks, strict=True):
        for task, index in enumerate(chunk):
            job_id = f"{array}_{task}"
            record = JobRecord(job_id, "sbatch", c.name, c.nodes, c.tasks_per_node, output, ranks)
            write_remote_record(remote, job_dirs[index], record)
            here = replace(record, ssh=c.ssh, ssh_config=c.ssh_config, remote_run_dir=str(job_dirs[index]))
            write_json(RunDir(run_dirs[index]).job, here)
            members.append(SweepMember(index, overrides[index], str(run_dirs[index]), job_id))
            there.append(SweepMember(index, overrides[index], str(job_dirs[index]), job_id))
    login_record = SweepRecord(arrays[0], c.name, there, array_job_ids=arrays)
    try:
        remote.write_file(str(RunDir(job_sweep).sweep), json.dumps(asdict(login_record), indent=2) + "\n")
    except RemoteError as err:
        raise SlurmUnavailable(f"submitted as job arrays {', '.join(arrays)}, but {err}") from None
    return SweepRecord(
        arrays[0],
        c.name,
        members,
        array_job_ids=arrays,
        ssh=c.ssh,
        ssh_config=c.ssh_config,
        remote_sweep_dir=str(job_sweep),
    )


class SbatchLauncher:
    def launch(self, cfg: Config, run_dir: Path) -> int:
        remote = Remote(cfg.cluster.ssh, cfg.cluster.ssh_config) if cfg.cluster.ssh else None
        with use_remote(remote):  # cluster.ssh: every Slurm command below runs on the login node
            return self._launch(cfg, run_dir.absolute(), remote)

    def _launch(self, cfg: Config, run_dir: Path, remote: Remote | None) -> int:
        secrets = sorted(secret_env(cfg.cluster.env)) if remote else []
        if secrets:  # they reach a job from sbatch's environment, which over ssh is the login node's
            err = ConfigError(
                f"cluster.env.{secrets[0]}",
                "(secret, not shown)",
                "a secret reaches the job "
                "from the environment sbatch runs in; over cluster.ssh, the login node's",
                valid="set it in the login node's environment (e.g. ~/.bashrc) and leave it "
                "out of cluster.env",
            )
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        # Where the run directory is where the job runs, and the job's working directory there.
        job_dir = Path(remote_run_dir(run_dir, cfg.cluster.remote_dir, project_dir())) if remote else run_dir
        workdir = _remote_workdir(cfg, job_dir) if remote else None
        try:
            script = render_script(cfg, job_dir, workdir)
        except ConfigError as err:
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        path = RunDir(run_dir).sbatch_script
        if cfg.dry_run:  # printed, not written: a dry run leaves nothing behind
            print_dry_run(cfg, run_dir, script)
            log.info("Without dry_run it is written to %s and submitted", path)
            if remote:
                log.info("and shipped to %s:%s, where sbatch runs", remote.destination, job_dir)
            return 0
        _write_private(path, script)
        check_client()
        try:
            take_snapshot(cfg.cluster, run_dir)
        except ConfigError as err:
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        export_secrets(cfg.cluster.env)  # sbatch propagates the submitter's environment to the job
        from hpctrain.launch.eval_job import write_eval_script

        write_eval_script(cfg, run_dir, run_dir)
        # Slurm does not create the --output directory; a job whose output cannot be opened fails unseen.
        (RunDir(run_dir).slurm).mkdir(parents=True, exist_ok=True)
        if remote:
            _write_private(RunDir(run_dir).remote_cli, remote_cli_script(cfg, job_dir, workdir or job_dir))
            ship_run(remote, run_dir, job_dir)
        job_id = submit_script(RunDir(job_dir).sbatch_script, workdir)
        c = cfg.cluster
        ranks = run_shape(cfg).world_size
        output = slurm_output(job_dir)
        record = JobRecord(job_id, "sbatch", c.name, c.nodes, c.tasks_per_node, output, ranks)
        if remote:
            # The login node's copy is a login node's record (no ssh); this one says where the run is.
            write_remote_record(remote, job_dir, record)
            record = replace(record, ssh=c.ssh, ssh_config=c.ssh_config, remote_run_dir=str(job_dir))
        write_json(RunDir(run_dir).job, record)
        print_submitted(record, run_dir)
        return 0


def _write_private(path: Path, text: str) -> None:
    path.touch(mode=0o700)
    path.chmod(0o700)  # the job script is the user's alone
    path.write_text(text)


def _remote_workdir(cfg: Config, job_dir: Path) -> Path:
    """The job's working directory on the cluster: the submit directory's copy in the project snapshot (the
    submit directory here is not there), or the run directory when the project is hpctrain itself."""
    entry = project_path_entry(plan_project(project_dir(), cfg.cluster.snapshot_paths), job_dir)
    return entry if entry is not None else job_dir


def remote_cli_script(cfg: Config, job_dir: Path, workdir: Path) -> str:
    """``hpctrain.sh``: the job's setup lines, then ``python -m hpctrain "$@"`` (the run's own snapshot), for
    ``hpctrain status|logs|cancel|summary`` from the laptop (:mod:`hpctrain.jobs.targets`)."""
    code = RunDir(job_dir).code
    entry = project_path_entry(plan_project(project_dir(), cfg.cluster.snapshot_paths), job_dir)
    return "\n".join(
        [
            "#!/bin/bash",
            "# hpctrain's commands on this run, with the code snapshot and setup its job has: the laptop",
            f"# that submitted it (cluster.ssh={cfg.cluster.ssh}) runs status|logs|cancel|summary here.",
            "set -euo pipefail",
            *setup_lines(cfg.cluster, code, entry, workdir),
            'exec python -m hpctrain "$@"',
            "",
        ]
    )


def ship_run(remote: Remote, run_dir: Path, job_dir: Path) -> None:
    """The run directory as it is now (config, script, code snapshot) into ``job_dir`` on the cluster."""
    try:
        way = remote.ship(run_dir, str(job_dir))
    except RemoteError as err:
        raise SlurmUnavailable(str(err)) from None
    log.info("Shipped %s to %s:%s (%s)", run_dir, remote.destination, job_dir, way)


def write_remote_record(remote: Remote, job_dir: Path, record: JobRecord) -> None:
    try:
        remote.write_file(str(RunDir(job_dir).job), json.dumps(asdict(record), indent=2) + "\n")
    except RemoteError as err:
        raise SlurmUnavailable(f"submitted as job {record.job_id}, but {err}") from None
