"""Every run a command would start, composed and checked before Hydra creates a directory or any process
starts: the config (one line per bad input), the user's model, data and loss on the meta device (once per
distinct combination), whether the run fits where it will run, the run directory (writable, not locked by a
live run) and, for Slurm, the size of the code snapshot. Imports torch only to probe a user's own code."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import model_spec
from hpctrain.precision import float8_problem


def precheck(
    overrides: list[str], multirun: bool, config_dirs: list[Path] | None = None
) -> tuple[Config, DictConfig]:
    """Compose and validate every run the command would start; raise ConfigError for the first bad one.
    Returns the first run's config, typed and as composed (with Hydra's node). ``config_dirs``: the
    user's ``--config-dir``."""
    from hpctrain.config.compose import compose, shadowed_choices, to_typed
    from hpctrain.config.validate import check_writable_dir
    from hpctrain.plan.check import check_run, data_for_model
    from hpctrain.submit.sweep import sweep_members

    checked = []
    probed: set[str] = set()
    warned: set[str] = set()
    for i, member in enumerate(sweep_members(overrides) if multirun else [overrides]):
        cfg = compose(member, config_dirs or [])
        typed = to_typed(cfg)
        choice = data_for_model(typed, member) if i == 0 else None
        if choice is not None:  # the data follows the model the user chose: say so, then check with it
            spec = model_spec(typed.model)
            taken = f"model {spec.name} takes {spec.input_kind}"
            print(f"hpctrain: {choice} ({taken}; choose another with data=...)")
            overrides.append(choice)  # the caller's list: Hydra's own run (sweeps, --cfg) gets it too
            return precheck(overrides, multirun, config_dirs)
        check_run(typed)
        if typed.trainer.precision == "fp8" and typed.cluster.kind == "local":
            check_float8_here()  # a Slurm job's device is known only on its node: the worker checks there
        if i == 0 and typed.cluster.kind == "local" and typed.cluster.fork_server:
            from hpctrain.launch.forked import check_server_env

            check_server_env()  # a HPCTRAIN_FORKSERVER that names no running server
        _probe_once(typed, probed)
        if typed.plan_check and (typed.cluster.gpus_per_node > 0 or typed.cluster.kind == "local"):
            # A user's model (no declared shapes) is measured first: imports torch, once per distinct model.
            from hpctrain.submit.fits import check_fits, check_fits_here
            from hpctrain.submit.measure import measured_for

            measured = measured_for(typed)
            if typed.cluster.gpus_per_node > 0:
                check_fits(typed, measured)  # the memory per GPU must fit
            else:
                check_fits_here(typed, measured)  # the processes must fit in this machine's memory
        checked.append((typed, cfg))
        for path in shadowed_choices(cfg, config_dirs or []):
            if path not in warned:  # Hydra finds hpctrain's conf/ first
                warned.add(path)
                note = f"hpctrain: warning: {path} is not used: hpctrain has an option so named"
                print(note, file=sys.stderr)
        if multirun:
            check_writable_dir("hydra.sweep.dir", Path(cfg.hydra.sweep.dir))
        else:
            check_writable_dir("hydra.run.dir", Path(cfg.hydra.run.dir))
            _check_unlocked(Path(cfg.hydra.run.dir))
    first = checked[0][0]
    _check_pack(first, len(checked), multirun)
    _check_eval_job(first, config_dirs or [])
    if first.cluster.kind == "slurm":  # a project too big to snapshot is refused before anything is written
        from hpctrain.launch.project import project_dir
        from hpctrain.launch.snapshot import plan_project

        plan_project(project_dir(), first.cluster.snapshot_paths)
        _check_partitions(first)
    return checked[0]


def _check_pack(cfg: Config, members: int, multirun: bool) -> None:
    """``cluster.pack`` packs members of a sweep into one job: no more than the sweep has."""
    from hpctrain.errors import ConfigError

    if cfg.cluster.pack > members:
        what = f"the sweep has {members} member{'s' * (members != 1)}" if multirun else "a single run"
        raise ConfigError(
            "cluster.pack",
            cfg.cluster.pack,
            f"packs sweep members into one job, and {what}",
            valid=f"1..{members}",
        )


def _check_eval_job(cfg: Config, config_dirs: list[Path]) -> None:
    """``trainer.eval_job`` names a Slurm cluster profile, and the run is on Slurm (its job submits them)."""
    from hpctrain.config.compose import group_options
    from hpctrain.config.sanity import check_text
    from hpctrain.errors import ConfigError

    name = cfg.trainer.eval_job
    if name is None:
        return
    check_text("trainer.eval_job", name)
    profiles = group_options("cluster", config_dirs)
    if name not in profiles:
        raise ConfigError("trainer.eval_job", name, "no cluster profile so named", valid=", ".join(profiles))
    if cfg.cluster.kind != "slurm":
        raise ConfigError(
            "trainer.eval_job", name,
            f"evaluation jobs are submitted by a Slurm job, and cluster={cfg.cluster.name} runs here",
            valid="a Slurm cluster profile for the run, or hpctrain eval RUN_DIR afterwards",
        )  # fmt: skip
    from hpctrain.launch.eval_job import eval_profile

    if eval_profile(name, config_dirs).kind != "slurm":
        raise ConfigError("trainer.eval_job", name, "not a Slurm cluster profile (cluster.kind=local)",
                          valid=", ".join(p for p in profiles if p != "local"))  # fmt: skip


def _check_partitions(cfg: Config) -> None:
    """Every partition of ``cluster.partition`` (a list a,b lets Slurm start the job where it can soonest)
    exists on the cluster. Skipped where no Slurm client can answer (a dry run away from the cluster)."""
    from hpctrain.errors import ConfigError
    from hpctrain.slurm.commands import SlurmUnavailable, partitions

    if not cfg.cluster.partition:
        return
    wanted = cfg.cluster.partition.split(",")
    if "" in wanted:
        raise ConfigError("cluster.partition", cfg.cluster.partition, "an empty partition name in the list",
                          valid="partition names joined by commas, e.g. debug,long")  # fmt: skip
    try:
        known = partitions()
    except (SlurmUnavailable, RuntimeError, OSError):
        return
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ConfigError(
            "cluster.partition",
            cfg.cluster.partition,
            f"no partition {unknown[0]} on this cluster",
            valid=", ".join(known) or "(sinfo lists none)",
        )


def _check_unlocked(run_dir: Path) -> None:
    """Refuse, before Hydra writes anything there, a run directory another live run holds."""
    from hpctrain.rundir import RunDir, RunLock

    if RunDir(run_dir).lock.is_file():
        RunLock(run_dir).acquire().release()


def _probe_once(cfg: Config, probed: set[str]) -> None:
    """Try the user's model, data and loss on the meta device (hpctrain.submit.probe), once per distinct
    combination of a sweep. Imports torch, but only for runs that bring their own code."""
    from hpctrain.submit.probe import needs_probe

    key = repr((cfg.model, cfg.data, cfg.loss, cfg.trainer.seed))
    if not needs_probe(cfg) or key in probed:
        return
    from hpctrain.submit.probe import probe

    probe(cfg)
    probed.add(key)


def local_gpu_capabilities(environ: dict[str, str] | None = None) -> list[tuple[int, int]]:
    """Compute capabilities of the GPUs this machine's workers would see, read from ``nvidia-smi`` (the
    driver's tool: no torch import, no CUDA context in this process), narrowed by ``CUDA_VISIBLE_DEVICES``
    when it lists indices. Empty: no NVIDIA driver, no GPU, or none visible."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    found = []
    for line in done.stdout.split():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append((int(major), int(minor)))
    if visible is not None and all(x.strip().isdigit() for x in visible.split(",")):
        found = [found[int(i)] for i in visible.split(",") if int(i) < len(found)]
    return found


def check_float8_here(capabilities: list[tuple[int, int]] | None = None) -> None:
    """``trainer.precision=fp8`` on this machine: every GPU a local worker may take must have float8 tensor
    cores, and torchao must be installed; else one line, before anything starts."""
    found = local_gpu_capabilities() if capabilities is None else capabilities
    problem = float8_problem(min(found) if found else None, importlib.util.find_spec("torchao") is not None)
    if problem is not None:
        raise ConfigError("trainer.precision", "fp8", problem, valid="fp32, bf16, fp16")
