"""The lines a Slurm job runs before its tasks, shared by the submitit launcher and the sbatch templates.

Environment values reach a shell here and are quoted (shlex.quote); a secret one (hpctrain.config.redact)
is not written at all: the job inherits it from the submitter's environment. ``cluster.setup`` lines are
shell by design (``source $HOME/venv/bin/activate && cd ~/proj``): each is written verbatim on a line of
its own, as the user would type it into the job script (validation refuses control characters, so a line
cannot hold a second one, and a line shlex cannot split, so an open quote cannot swallow the next ones).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hpctrain.config.redact import is_secret
from hpctrain.config.schema import ClusterConfig
from hpctrain.launch.project import PROJECT_DIR_ENV, project_dir
from hpctrain.slurm.badnodes import RECORD_ENV
from hpctrain.slurm.commands import REQUESTED_TIME_ENV
from hpctrain.slurm.spec import parse_time_limit


def setup_lines(
    cluster: ClusterConfig, snapshot: Path, project: Path | None = None, submit_dir: Path | None = None
) -> list[str]:
    """The job's first lines. ``project``: the user's project copy in the snapshot (on PYTHONPATH after the
    package snapshot, so a user module cannot shadow hpctrain's); ``submit_dir``: the folder the run was
    submitted from, exported as HPCTRAIN_PROJECT_DIR (the job already runs there: sbatch's working
    directory is the one it was called from)."""
    # The snapshot goes first on the path, and PYTHONSAFEPATH (Python ≥ 3.11) keeps `python -m` from putting
    # the job's working directory — often a checkout of this package — ahead of it.
    entries = ":".join(shlex.quote(str(p)) for p in (snapshot, project) if p is not None)
    lines = [
        f"export PYTHONPATH={entries}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONSAFEPATH=1",
    ]
    if submit_dir is not None:
        lines.append(f"export {PROJECT_DIR_ENV}={shlex.quote(str(submit_dir))}")
    record = node_record(cluster, submit_dir)
    if (
        record is not None
    ):  # where the job's supervisors write the nodes it excludes (hpctrain.slurm.badnodes)
        lines.append(f"export {RECORD_ENV}={shlex.quote(str(record))}")
    if cluster.time_min is not None:  # a requeue asks for it again (hpctrain.slurm.commands.requeue)
        lines.append(f"export {REQUESTED_TIME_ENV}={parse_time_limit(cluster.time)}")
    for name, value in cluster.env.items():
        if is_secret(name):  # never written: the job inherits it from the submitter's environment
            lines.append(f"# {name}: from the submitting process's environment (a secret, not recorded)")
        else:
            lines.append(f"export {name}={shlex.quote(str(value))}")
    lines += list(cluster.setup)  # shell by design: verbatim
    return lines


def node_record(cluster: ClusterConfig, submit_dir: Path | None = None) -> Path | None:
    """The project's node record (``cluster.bad_node_file``, relative to the submit directory), or None when
    it is off (no file, a TTL of 0)."""
    if not cluster.bad_node_file or cluster.bad_node_ttl_h <= 0:
        return None
    path = Path(os.path.expanduser(cluster.bad_node_file))
    return path if path.is_absolute() else (submit_dir or project_dir()) / path


def allocation_nodes(cluster: ClusterConfig) -> int:
    """The nodes a job asks Slurm for: ``cluster.nodes`` and its waiting spares (``cluster.spare_nodes``)."""
    return cluster.nodes + cluster.spare_nodes


def survives_lost_nodes(cluster: ClusterConfig) -> bool:
    """Whether a lost node must not end the job (spares, or shrinking onto fewer nodes)."""
    return bool(cluster.spare_nodes) or (cluster.min_nodes is not None and cluster.min_nodes < cluster.nodes)


def container_srun_args(cluster: ClusterConfig) -> list[str]:
    """srun's own options: pyxis/enroot's (values validated against SAFE_CONTAINER / SAFE_MOUNT), and
    ``--no-kill`` where a lost node must not end the step (its tasks are then not taken for failed: the
    surviving restart agents replace the node or shrink, hpctrain.launch.agent)."""
    args = ["--no-kill"] if survives_lost_nodes(cluster) else []
    if cluster.container_image is None:
        return args
    args.append(f"--container-image={cluster.container_image}")
    if cluster.container_mounts:
        args.append(f"--container-mounts={','.join(cluster.container_mounts)}")
    return args
