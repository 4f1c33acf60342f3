"""``launcher=sbatch``: render an sbatch script from the composed config, write it, submit it with sbatch.

The script is ``<run dir>/job.sbatch``, rendered from ``hpctrain/sbatch_templates/<cluster.sbatch_template>
.sbatch.j2``: ``srun`` (one Slurm task per rank) or ``torchrun`` (one task per node, torchrun starts the
ranks). It is a plain file a person can read, edit and submit again. ``dry_run=true`` prints it
and writes and submits nothing. No torch import on this path: it runs on login nodes.

Every config value that reaches the script was validated (:func:`hpctrain.config.validate._check_cluster`)
or is quoted here or in the template (the ``quote`` filter is :func:`shlex.quote`).
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

import jinja2

from hpctrain.config.redact import export_secrets
from hpctrain.config.schema import ClusterConfig, Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import ConfigError
from hpctrain.launch.jobscript import container_srun_args, setup_lines
from hpctrain.launch.project import project_dir
from hpctrain.launch.snapshot import plan_project, project_path_entry
from hpctrain.launch.submitit import print_dry_run, print_submitted, take_snapshot
from hpctrain.plan.check import check_run
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import JobRecord, write_json
from hpctrain.slurm.commands import check_client, submit_script

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "sbatch_templates"
EXIT_BAD_CONFIG = 2


def template_path(name: str) -> Path:
    return TEMPLATE_DIR / f"{name}.sbatch.j2"


def slurm_output(run_dir: Path) -> str:
    """Where the job's stdout/stderr go: ``<run dir>/slurm/%j.out`` (Slurm puts the job id for ``%j``)."""
    return str(RunDir(run_dir).slurm / "%j.out")


def render_script(cfg: Config, run_dir: Path) -> str:
    """The sbatch script for the run in ``run_dir``, from ``cluster.sbatch_template``.

    Validates ``cfg`` first (ConfigError): the templates rely on the checks for what they do not quote. The
    user's project copy (:func:`hpctrain.launch.snapshot.plan_project`) follows the package on PYTHONPATH.
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
    # In a container the image's python runs the job; otherwise the submitting interpreter, as with submitit.
    python = "python" if c.container_image else sys.executable
    # Slurm expands %-patterns in --output: a literal % in the run directory is written %%.
    output = str(RunDir(run_dir).slurm).replace("%", "%%") + "/%j.out"
    return template.render(
        run_dir=str(run_dir),
        job_name=c.job_name,
        partition=c.partition,
        account=c.account,
        qos=c.qos,
        time=c.time.strip(),
        nodes=c.nodes,
        tasks_per_node=c.tasks_per_node,
        cpus_per_task=c.cpus_per_task,
        gpus_per_node=c.gpus_per_node,
        mem=c.mem,
        constraint=c.constraint,
        exclude=c.exclude,
        signal=c.signal,
        signal_lead_s=c.signal_lead_s,
        output=output,
        setup_lines=setup_lines(
            c,
            RunDir(run_dir).code,
            project_path_entry(plan_project(project_dir(), c.snapshot_paths), run_dir),
            project_dir(),
        ),
        srun_args=container_srun_args(c),
        python=python,
        extra_options=_extra_options(c),
    )


def _extra_options(c: ClusterConfig) -> list[str]:
    """``--name=value`` / ``--flag`` for the sbatch options beyond the template's fixed lines (validated)."""
    from hpctrain.launch.submitit import sbatch_extras

    options = {
        "exclusive": True if c.exclusive else None, "gres": c.gres, "gpus-per-task": c.gpus_per_task,
        "mail-user": c.mail_user, "mail-type": c.mail_type, "dependency": c.dependency,
    }  # fmt: skip
    extras = {k: v for k, v in sbatch_extras(c).items() if k not in ("requeue", "signal")}
    return [
        f"--{name}" if value is True else f"--{name}={value}"
        for name, value in {**options, **extras}.items()
        if value is not None
    ]


class SbatchLauncher:
    def launch(self, cfg: Config, run_dir: Path) -> int:
        run_dir = run_dir.absolute()
        try:
            script = render_script(cfg, run_dir)
        except ConfigError as err:
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        path = RunDir(run_dir).sbatch_script
        if cfg.dry_run:  # printed, not written: a dry run leaves nothing behind
            print_dry_run(cfg, run_dir, script)
            log.info("Without dry_run it is written to %s and submitted", path)
            return 0
        path.touch(mode=0o700)
        path.chmod(0o700)  # the job script is the user's alone
        path.write_text(script)
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
        job_id = submit_script(path)
        c = cfg.cluster
        ranks = run_shape(cfg).world_size
        record = JobRecord(job_id, "sbatch", c.name, c.nodes, c.tasks_per_node, slurm_output(run_dir), ranks)
        write_json(RunDir(run_dir).job, record)
        print_submitted(record, run_dir)
        return 0
