"""Every run a command would start, composed and checked before Hydra creates a directory or any process
starts: the config (one line per bad input), the user's model, data and loss on the meta device (once per
distinct combination), whether the run fits where it will run, the run directory (writable, not locked by a
live run) and, for Slurm, the size of the code snapshot. Imports torch only to probe a user's own code."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import Config
from hpctrain.models.spec import model_spec


def precheck(
    overrides: list[str], multirun: bool, config_dirs: list[Path] | None = None, said: list[str] | None = None
) -> tuple[Config, DictConfig]:
    """Compose and validate every run the command would start; raise ConfigError for the first bad one.
    Returns the first run's config, typed and as composed (with Hydra's node). ``config_dirs``: the
    user's ``--config-dir``. What was chosen for the user (the data of a model) is said once all passed:
    a refused command prints its one line and nothing else."""
    if said is None:
        said = []
        checked = precheck(overrides, multirun, config_dirs, said)
        for line in said:
            print(line)
        return checked
    from hpctrain.config.compose import (
        compose,
        literal_script_args,
        plain_parameters,
        shadowed_choices,
        sweeper_params,
        to_typed,
    )
    from hpctrain.config.validate import check_writable_dir
    from hpctrain.plan.check import check_run, data_for_model
    from hpctrain.submit.existing import check_existing, named_run_overrides
    from hpctrain.submit.sweep import sweep_members

    # A parameter of a user's factory needs no +: the caller's list (Hydra's own run and sweeps use it too).
    overrides[:] = plain_parameters(literal_script_args(sweeper_params(overrides)), config_dirs or [])
    checked = []
    probed: set[str] = set()
    warned: set[str] = set()
    for i, member in enumerate(sweep_members(overrides) if multirun else [overrides]):
        cfg = compose(member, config_dirs or [])
        typed = to_typed(cfg)
        named = named_run_overrides(typed.run, overrides, multirun) if i == 0 else []
        if named:  # run=NAME: its stable directory, for this check and for Hydra's own run alike
            overrides.extend(named)
            return precheck(overrides, multirun, config_dirs, said)
        choice = data_for_model(typed, member) if i == 0 else None
        if choice is not None:  # the data follows the model the user chose: say so, then check with it
            spec = model_spec(typed.model)
            taken = f"model {spec.name} takes {spec.input_kind}"
            said.append(f"hpctrain: {choice} ({taken}; choose another with data=...)")
            overrides.append(choice)  # the caller's list: Hydra's own run (sweeps, --cfg) gets it too
            return precheck(overrides, multirun, config_dirs, said)
        check_run(typed)
        if i == 0 and typed.cluster.kind == "slurm" and not typed.dry_run:
            _check_slurm_here(typed)  # before the probe and the snapshot: nothing to do where none submits
            _check_not_example(typed)
        _probe_once(typed, probed)
        if typed.model.init_from is not None and not multirun:
            _check_init_from(typed, resolved_dir(cfg, "hydra.run.dir"), probed)
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
            check_writable_dir("hydra.sweep.dir", resolved_dir(cfg, "hydra.sweep.dir"))
        else:
            run_dir = resolved_dir(cfg, "hydra.run.dir")
            check_writable_dir("hydra.run.dir", run_dir)
            _check_unlocked(run_dir)
            check_existing(run_dir, typed, cfg)  # new, empty, or a run this one continues
    first = checked[0][0]
    if first.cluster.kind == "slurm":  # a project too big to snapshot is refused before anything is written
        from hpctrain.launch.project import project_dir
        from hpctrain.launch.snapshot import plan_project

        plan_project(project_dir(), first.cluster.snapshot_paths)
    return checked[0]


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
            key, value, "empty: the run would be written into the current folder",
            valid="a folder of its own, e.g. outputs/NAME (or run=NAME)",
        )  # fmt: skip
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
    spec = model_spec(typed.model)
    print(f"hpctrain: {choice} (model {spec.name} takes {spec.input_kind}; choose another with data=...)")
    return to_typed(compose([*overrides, choice], config_dirs or []))


def _check_slurm_here(cfg: Config) -> None:
    """A Slurm profile needs a Slurm client that knows its controller: refused in one line before Hydra
    makes a run or sweep directory (a laptop, a login node without SLURM_CONF)."""
    from hpctrain.errors import ConfigError
    from hpctrain.slurm.commands import SlurmUnavailable, check_client

    try:
        check_client()
    except SlurmUnavailable as err:
        raise ConfigError(
            "cluster", cfg.cluster.name, f"cannot submit from here: {err}",
            valid="a machine with Slurm's client and configuration, dry_run=true to see the submission, "
            "or cluster=local",
        ) from None  # fmt: skip


def _check_init_from(cfg: Config, run_dir: Path, probed: set[str]) -> None:
    """``model.init_from`` fits the model (names and shapes, from the weights' headers), unless this run
    continues a checkpoint of its own, where init_from is ignored. Imports torch (only for init_from)."""
    from hpctrain.rundir import RunDir
    from hpctrain.rundir import checkpoints as layout

    key = repr(("init_from", cfg.model, cfg.data))
    own = cfg.trainer.resume != "never" and layout.committed(RunDir(run_dir).checkpoints)
    if key in probed or own or cfg.trainer.resume not in ("auto", "never"):
        return
    from hpctrain.submit.probe import check_init_from

    check_init_from(cfg)
    probed.add(key)


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


def _check_not_example(cfg: Config) -> None:
    """An example profile is not submitted with its placeholders: one line saying which and what to do."""
    from hpctrain.errors import ConfigError

    note = example_note(cfg)
    if note is not None:
        raise ConfigError(
            "cluster", cfg.cluster.name, "is an example profile: " + note.split(": ", 1)[1],
            valid=f"a profile of your own (conf/cluster/{cfg.cluster.name}.yaml copied into your "
            "--config-dir's cluster/ under a new name, your site's values, example: false), or "
            "cluster.example=false",
        )  # fmt: skip


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
