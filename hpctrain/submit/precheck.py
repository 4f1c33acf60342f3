"""The submission's own checks, which :mod:`hpctrain.submit.submission` calls in the order of its table:
the Slurm site (ssh, a client here, partitions, an example profile), packs and evaluation jobs, the run
directory's lock, this shell's Slurm counts, fp8 on this machine's GPUs. The face the CLI calls is
:func:`hpctrain.submit.submission.precheck` (this module imports nothing of the submission: no cycle). Imports
torch only to probe a user's own code (elsewhere, through the table)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import model_spec
from hpctrain.precision import float8_problem
from hpctrain.slurm.remote import Remote


def check_pack(cfg: Config, members: int, multirun: bool) -> None:
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


def check_eval_job(cfg: Config, config_dirs: list[Path]) -> None:
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
            "trainer.eval_job",
            name,
            f"evaluation jobs are submitted by a Slurm job, and cluster={cfg.cluster.name} runs here",
            valid="a Slurm cluster profile for the run, or hpctrain eval RUN_DIR afterwards",
        )
    from hpctrain.launch.eval_job import eval_profile

    if eval_profile(name, config_dirs).kind != "slurm":
        raise ConfigError(
            "trainer.eval_job",
            name,
            "not a Slurm cluster profile (cluster.kind=local)",
            valid=", ".join(p for p in profiles if p != "local"),
        )


def check_partitions(cfg: Config) -> None:
    """Every partition of ``cluster.partition`` (a list a,b lets Slurm start the job where it can soonest)
    exists on the cluster. Skipped where no Slurm client can answer (a dry run away from the cluster)."""
    from hpctrain.errors import ConfigError
    from hpctrain.slurm.commands import SlurmUnavailable, partitions

    if not cfg.cluster.partition:
        return
    wanted = cfg.cluster.partition.split(",")
    if "" in wanted:
        raise ConfigError(
            "cluster.partition",
            cfg.cluster.partition,
            "an empty partition name in the list",
            valid="partition names joined by commas, e.g. debug,long",
        )
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


def resolved_dir(cfg: DictConfig, key: str) -> Path:
    """``hydra.run.dir`` / ``hydra.sweep.dir`` resolved, or a one-line ConfigError: an interpolation that
    cannot be resolved, or an empty value (the run would be written into the current folder)."""
    from omegaconf import OmegaConf

    from hpctrain.errors import ConfigError, first_line

    raw = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
    try:
        value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    except Exception as err:  # OmegaConf's interpolation errors, over several lines
        given = cfg.hydra.run._get_node(key.rsplit(".", 1)[1])._value() if key == "hydra.run.dir" else raw
        raise ConfigError(key, given, f"cannot be resolved: {first_line(err)}") from None
    if value is None or not str(value).strip():
        raise ConfigError(
            key,
            value,
            "empty: the run would be written into the current folder",
            valid="a folder of its own, e.g. outputs/NAME (or run=NAME)",
        )
    return Path(str(value))


def composed_run(overrides: list[str], config_dirs: list[Path] | None = None) -> Config:
    """The run exactly as ``hpctrain train`` would compose it (``hpctrain plan`` plans that one): the data
    that feeds the model when none was chosen (said in one line, as train says it), the run's name."""
    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.check import data_for_model

    typed = to_typed(compose(overrides, config_dirs or []))
    choice = data_for_model(typed, overrides)
    if choice is None:
        return typed
    print(data_choice_line(typed, choice))
    return to_typed(compose([*overrides, choice], config_dirs or []))


def data_choice_line(cfg: Config, choice: str) -> str:
    """The line that says which data was chosen for the model (``data=OPTION``), and how to choose another."""
    spec = model_spec(cfg.model)
    return f"hpctrain: {choice} (model {spec.name} takes {spec.input_kind}; choose another with data=...)"


def check_ssh_sweep(cfg: Config, multirun: bool, composed: DictConfig) -> None:
    """``cluster.ssh``: a sweep goes as sbatch job arrays shipped to the login node, so what needs submitit's
    tasks (``cluster.pack``'s packs) or this machine to read the members' results while they run (a sweeper
    other than Hydra's basic one, such as Optuna) is refused."""
    if cfg.cluster.ssh is None or not multirun:
        return
    if cfg.cluster.pack > 1:
        raise ConfigError(
            "cluster.pack",
            cfg.cluster.pack,
            "packs run as submitit's tasks, which submit from this machine, not over cluster.ssh",
            valid="1 with cluster.ssh, or submit the packed sweep from the login node",
        )
    sweeper = str(composed.hydra.sweeper.get("_target_", "BasicSweeper"))
    if "BasicSweeper" not in sweeper:
        raise ConfigError(
            "hydra.sweeper",
            sweeper.rsplit(".", 1)[-1],
            "chooses trials from the members' results, which are on the cluster, not here (cluster.ssh)",
            valid="the basic sweeper (a grid) over cluster.ssh, or this one on the login node",
        )


def check_slurm_here(cfg: Config) -> None:
    """A Slurm profile needs a Slurm client that knows its controller: refused in one line before Hydra
    makes a run or sweep directory (a laptop, a login node without SLURM_CONF). Over ``cluster.ssh``, the
    login node must answer: unreachable, a host key that does not match, a login refused are one line."""
    from hpctrain.errors import ConfigError
    from hpctrain.slurm.commands import SlurmUnavailable, check_client
    from hpctrain.slurm.remote import RemoteError

    if cfg.cluster.ssh is not None:
        try:
            Remote(cfg.cluster.ssh, cfg.cluster.ssh_config).connect()
        except RemoteError as err:
            raise ConfigError("", cfg.cluster.ssh, str(err)) from None
        return

    try:
        check_client()
    except SlurmUnavailable as err:
        raise ConfigError(
            "cluster",
            cfg.cluster.name,
            f"cannot submit from here: {err}",
            valid="a machine with Slurm's client and configuration, dry_run=true to see the submission, "
            "or cluster=local",
        ) from None


def example_note(cfg: Config) -> str | None:
    """What an example profile's placeholders are, in words (None for a profile of the user's)."""
    c = cfg.cluster
    if c.kind != "slurm" or not c.example:
        return None
    setup = "; ".join(c.setup) or "none"
    return (
        f"cluster={c.name} is an example profile: its partition ({c.partition or 'default'}), account "
        f"({c.account or 'unset'}), qos ({c.qos or 'unset'}) and setup ({setup}) are placeholders"
    )


def check_not_example(cfg: Config) -> None:
    """An example profile is not submitted with its placeholders: one line saying which and what to do."""
    from hpctrain.errors import ConfigError

    note = example_note(cfg)
    if note is not None:
        raise ConfigError(
            "cluster",
            cfg.cluster.name,
            "is an example profile: " + note.split(": ", 1)[1],
            valid=f"a profile of your own (conf/cluster/{cfg.cluster.name}.yaml copied into your "
            "--config-dir's cluster/ under a new name, your site's values, example: false), or "
            "cluster.example=false",
        )


def check_unlocked(run_dir: Path) -> None:
    """Refuse, before Hydra writes anything there, a run directory another live run holds."""
    from hpctrain.rundir import RunDir, RunLock

    if RunDir(run_dir).lock.is_file():
        RunLock(run_dir).acquire().release()


def check_slurm_counts() -> None:
    from hpctrain.slurm.spec import malformed_count

    found = malformed_count(dict(os.environ))
    if found is not None:
        raise ConfigError(
            found[0],
            found[1],
            "in this shell's environment, and not a count as Slurm sets it",
            valid=f"an integer ≥ 0, or unset {found[0]}",
        )


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
            capture_output=True,
            text=True,
            timeout=30,
        )
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
