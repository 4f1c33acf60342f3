"""The cluster group's rules: a local run's processes, a Slurm job's resources, and every value that reaches
an sbatch line (checked for characters a shell or sbatch would act on). Torch-free."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from hpctrain.config.sanity import at_least, check_local_cluster, one_of
from hpctrain.config.schema import Config
from hpctrain.config.shape import world_size
from hpctrain.errors import ConfigError
from hpctrain.faults import check_fault_ranks
from hpctrain.slurm.remote import DESTINATION_HELP, destination_problem
from hpctrain.slurm.spec import (
    DEPENDENCY,
    ENV_NAME,
    MAIL_TYPES,
    MAIL_USER,
    RESERVED_SBATCH,
    SAFE_CONSTRAINT,
    SAFE_CONTAINER,
    SAFE_MOUNT,
    SAFE_SLURM_TOKEN,
    SBATCH_OPTION,
    TIME_FORMATS_HELP,
    parse_time_limit,
)

CLUSTER_KINDS = ("local", "slurm")
LAUNCHERS = {"local": ("auto", "local"), "slurm": ("auto", "submitit", "sbatch")}
SBATCH_TEMPLATES = ("srun", "torchrun")
# USR1 is left to NCCL; KILL and STOP cannot be caught.
WARNING_SIGNALS = ("USR2", "TERM", "INT", "HUP", "URG")


def check_health_script(path: str) -> None:
    """cluster.health_check: an absolute path to an executable file (every node must see it there)."""
    valid = "an absolute path to an executable script that exits 0 on a healthy node"
    if not path or any(ord(ch) < 32 for ch in path) or not os.path.isabs(path):
        raise ConfigError("cluster.health_check", path, "not an absolute path", valid=valid)
    if not os.path.isfile(path):
        raise ConfigError("cluster.health_check", path, "no such file", valid=valid)
    if not os.access(path, os.X_OK):
        raise ConfigError("cluster.health_check", path, "not executable (chmod +x)", valid=valid)


def check_lost_nodes(cfg: Config) -> None:
    """cluster.spare_nodes and cluster.min_nodes: a lost node is answered by a restart inside the allocation
    (on a spare, or on fewer nodes), so both need restarts, the srun-started agents, and a layout that runs
    on every node count down to min_nodes."""
    from hpctrain.config.shrink import on_nodes

    c = cfg.cluster
    if c.min_nodes is not None:
        at_least("cluster.min_nodes", c.min_nodes, 1)
        if c.min_nodes > c.nodes:
            raise ConfigError(
                "cluster.min_nodes", c.min_nodes, f"more than cluster.nodes={c.nodes}", valid=f"1..{c.nodes}"
            )
    shrinks = c.min_nodes is not None and c.min_nodes < c.nodes
    if not c.spare_nodes and not shrinks:
        return
    key, value = (
        ("cluster.spare_nodes", c.spare_nodes) if c.spare_nodes else ("cluster.min_nodes", c.min_nodes)
    )
    if c.max_restarts < 1:
        raise ConfigError(
            key,
            value,
            "a lost node is replaced (or left out) by a restart inside the allocation, and "
            "cluster.max_restarts=0",
            valid="cluster.max_restarts ≥ 1 with it",
        )
    if cfg.launcher == "sbatch" and c.sbatch_template == "torchrun":
        raise ConfigError(
            key,
            value,
            "the torchrun template's agent keeps its nodes (no spares, no shrinking)",
            valid="cluster.sbatch_template=srun or launcher=submitit with it",
        )
    for nodes in range(c.min_nodes or c.nodes, c.nodes):
        on_nodes(cfg, nodes)


WORKERS_PER_CPU = 4  # loader processes beyond a few per CPU only wait for one, each holding its memory


def check_num_workers(cfg: Config) -> None:
    """data.num_workers is per rank: more than a few loader processes per CPU a rank can have only fights
    for them (100000 would fork until the node runs out of memory). The CPUs: this machine's for a local
    run; for a Slurm job, cluster.cpus_per_task or this machine's, whichever is more (a login node may
    have fewer than the compute nodes)."""
    here = os.cpu_count() or 1
    cpus = here if cfg.cluster.kind == "local" else max(cfg.cluster.cpus_per_task, here)
    most = WORKERS_PER_CPU * cpus
    if cfg.data.num_workers > most:
        where = (
            "this machine's"
            if cfg.cluster.kind == "local"
            else "the CPUs a rank has (cluster.cpus_per_task or this machine's)"
        )
        raise ConfigError(
            "data.num_workers",
            cfg.data.num_workers,
            f"more loader processes per rank than {WORKERS_PER_CPU} × {where} {cpus} CPUs",
            valid=f"0 to {most}",
        )


def check_cluster(cfg: Config) -> None:
    """The cluster group: local processes, or a Slurm job and every sbatch option it renders."""
    c = cfg.cluster
    one_of("cluster.kind", c.kind, CLUSTER_KINDS)
    one_of("launcher", cfg.launcher, LAUNCHERS[c.kind])
    at_least("cluster.dist_timeout_s", c.dist_timeout_s, 1)
    at_least("cluster.pack", c.pack, 1)
    at_least("cluster.kill_grace_s", c.kill_grace_s, 0.0)
    at_least("cluster.max_restarts", c.max_restarts, 0)
    at_least("cluster.max_no_progress", c.max_no_progress, 1)
    if c.nproc >= 1 and c.nodes >= 1 and c.tasks_per_node >= 1:  # else refused below, naming its key
        check_fault_ranks(cfg.faults, world_size(cfg))
    check_num_workers(cfg)
    if c.health_check is not None:
        check_health_script(c.health_check)
    at_least("cluster.bad_node_ttl_h", c.bad_node_ttl_h, 0.0)
    if c.bad_node_file is not None and not c.bad_node_file.strip():
        raise ConfigError(
            "cluster.bad_node_file",
            c.bad_node_file,
            "empty",
            valid="a file path (relative to the submit directory, or absolute), or null for no record",
        )
    check_ssh(cfg)
    at_least("cluster.spare_nodes", c.spare_nodes, 0)
    if c.kind == "local":
        if c.spare_nodes or c.min_nodes is not None:
            key, value = (
                ("cluster.spare_nodes", c.spare_nodes)
                if c.spare_nodes
                else ("cluster.min_nodes", c.min_nodes)
            )
            raise ConfigError(
                key,
                value,
                "spare nodes and shrinking are for a Slurm job's nodes",
                valid="0 and null for cluster.kind=local",
            )
        at_least("cluster.nproc", c.nproc, 1)
        check_local_cluster(c.nproc, c.master_addr)
        return
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "array_parallelism"):
        at_least(f"cluster.{key}", getattr(c, key), 1)
    for key in ("gpus_per_node", "max_requeues", "signal_lead_s"):
        at_least(f"cluster.{key}", getattr(c, key), 0)
    check_lost_nodes(cfg)
    if c.gpus_per_node and c.tasks_per_node > c.gpus_per_node:
        raise ConfigError(
            "cluster.tasks_per_node",
            c.tasks_per_node,
            f"one task per GPU, and cluster.gpus_per_node={c.gpus_per_node}",
            valid=f"1..{c.gpus_per_node}",
        )
    try:
        minutes = parse_time_limit(c.time)
    except ValueError:
        raise ConfigError("cluster.time", c.time, "not a Slurm time limit", valid=TIME_FORMATS_HELP) from None
    shortest, named = minutes, f"cluster.time={c.time}"
    if c.time_min is not None:
        shortest, named = _time_min(c.time_min, c.time, minutes), f"cluster.time_min={c.time_min}"
    if c.signal_lead_s >= shortest * 60:  # the warning must come after the start of the shortest job granted
        raise ConfigError(
            "cluster.signal_lead_s",
            c.signal_lead_s,
            f"the warning would come before the job starts: {named} is {shortest * 60} s",
            valid=f"< {shortest * 60}",
        )
    one_of("cluster.signal", c.signal, WARNING_SIGNALS)
    one_of("cluster.sbatch_template", c.sbatch_template, SBATCH_TEMPLATES)
    for key in ("partition", "account", "qos", "exclude", "job_name", "mem"):
        value = getattr(c, key)
        if value is not None:
            safe_token(f"cluster.{key}", value)
    check_sbatch_options(c)
    if c.constraint is not None and not SAFE_CONSTRAINT.fullmatch(c.constraint):
        raise ConfigError(
            "cluster.constraint",
            c.constraint,
            "not a Slurm feature expression",
            valid="features joined by & | , with [ ] ( ) *",
        )
    for name in c.env:
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(f"cluster.env.{name}", c.env[name], "not a valid environment variable name")
    for line in c.setup:
        try:
            shlex.split(line)
        except ValueError as err:
            raise ConfigError("cluster.setup", line, f"cannot be split into words: {err}") from None
    if c.container_image is not None and not SAFE_CONTAINER.fullmatch(c.container_image):
        raise ConfigError("cluster.container_image", c.container_image, "not an image reference or path")
    for mount in c.container_mounts:
        if not SAFE_MOUNT.fullmatch(mount):
            raise ConfigError("cluster.container_mounts", mount, "not a mount", valid="SRC:DST[:FLAGS]")
    for path in c.snapshot_paths:
        parts = path.replace("\\", "/").split("/")
        if (
            not path
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in path)
            or path.startswith(("/", "~"))
            or ".." in parts
        ):
            raise ConfigError(
                "cluster.snapshot_paths",
                path,
                "not a path inside the submit directory",
                valid="relative paths without .. or control characters, e.g. [mynets,conf]",
            )


def safe_token(key: str, value: Any) -> None:
    """Refuse (one line) a value that a shell or sbatch would act on: it goes into the job script as is."""
    if not SAFE_SLURM_TOKEN.fullmatch(str(value)):
        raise ConfigError(
            key,
            value,
            "contains characters a shell or sbatch would act on",
            valid="letters, digits and _ . , : @ % + = [ ] -",
        )


def check_sbatch_options(c: Any) -> None:
    """The sbatch options of their own keys and ``cluster.additional`` (any other one, by its long name)."""
    for key in ("gres", "reservation"):
        value = getattr(c, key)
        if value is not None:
            safe_token(f"cluster.{key}", value)
    if c.gpus_per_task is not None:
        at_least("cluster.gpus_per_task", c.gpus_per_task, 1)
    if c.mail_user is not None and not MAIL_USER.fullmatch(c.mail_user):
        raise ConfigError("cluster.mail_user", c.mail_user, "not an e-mail address", valid="user@host")
    if c.mail_type is not None:
        for kind in c.mail_type.split(","):
            one_of("cluster.mail_type", kind, MAIL_TYPES)
    if c.dependency is not None and not DEPENDENCY.fullmatch(c.dependency):
        raise ConfigError(
            "cluster.dependency",
            c.dependency,
            "not a Slurm dependency",
            valid="e.g. afterok:1234, afterany:12:13, singleton",
        )
    for name, value in c.additional.items():
        key = f"cluster.additional.{name}"
        if not SBATCH_OPTION.fullmatch(str(name)):
            raise ConfigError(
                key, value, "not an sbatch long option name", valid="e.g. comment, nice, licenses"
            )
        if str(name).replace("_", "-") in RESERVED_SBATCH:
            raise ConfigError(
                key,
                value,
                "hpctrain sets this option itself",
                valid="its own key, e.g. cluster.exclusive, cluster.mail_type",
            )
        if isinstance(value, bool) or value is None:
            continue  # a flag (true), or left out
        safe_token(key, value)


def check_ssh(cfg: Config) -> None:
    """``cluster.ssh`` (submit from a laptop), ``cluster.ssh_config`` and ``cluster.remote_dir``: a
    destination ssh cannot read as an option, files and folders without control characters, and the
    sbatch launcher (submitit's executor runs sbatch on this machine)."""
    c = cfg.cluster
    if c.ssh is None:
        for key in ("ssh_config", "remote_dir"):
            if getattr(c, key) is not None:
                raise ConfigError(
                    f"cluster.{key}",
                    getattr(c, key),
                    "is for cluster.ssh, which is not set",
                    valid="set cluster.ssh=USER@HOST too, or leave it out",
                )
        return
    problem = destination_problem(c.ssh)
    if problem is not None:
        raise ConfigError("cluster.ssh", c.ssh, problem, valid=DESTINATION_HELP)
    if c.kind != "slurm":
        raise ConfigError(
            "cluster.ssh",
            c.ssh,
            "submits to a Slurm cluster, and cluster.kind=local",
            valid="a Slurm profile (cluster=NAME), or no cluster.ssh",
        )
    if cfg.launcher == "submitit":
        raise ConfigError(
            "launcher",
            cfg.launcher,
            "submitit runs sbatch on this machine, and cluster.ssh submits on the login node",
            valid="sbatch or auto",
        )
    if cfg.trainer.eval_job is not None:
        raise ConfigError(
            "trainer.eval_job",
            cfg.trainer.eval_job,
            "is not submitted over cluster.ssh yet",
            valid="null, or submit from the login node",
        )
    for key, path in (("ssh_config", c.ssh_config), ("remote_dir", c.remote_dir)):
        if path is None:
            continue
        if not path or any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
            raise ConfigError(f"cluster.{key}", path, "empty or contains a control character")
        if not path.startswith("/"):
            where = "here" if key == "ssh_config" else "on the cluster"
            raise ConfigError(f"cluster.{key}", path, "not an absolute path", valid=f"a full path {where}")
    if c.ssh_config is not None and not Path(c.ssh_config).is_file():
        raise ConfigError(
            "cluster.ssh_config",
            c.ssh_config,
            "no such file",
            valid="an ssh config file (ssh -F), or null for ~/.ssh/config",
        )


def _time_min(text: str, time: str, minutes: int) -> int:
    """Minutes of ``cluster.time_min`` (sbatch --time-min): a Slurm time limit, at most ``cluster.time``
    (Slurm itself would refuse one over the limit only at submit)."""
    try:
        least = parse_time_limit(text)
    except ValueError:
        raise ConfigError(
            "cluster.time_min", text, "not a Slurm time limit", valid=TIME_FORMATS_HELP
        ) from None
    if least > minutes:
        longer = f"longer than cluster.time={time} ({minutes} min)"
        raise ConfigError("cluster.time_min", text, longer, valid=f"≤ {minutes} min")
    return least
