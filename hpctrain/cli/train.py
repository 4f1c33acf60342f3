"""``hpctrain [train] [OVERRIDES...]``: compose a run with Hydra, check it, hand it to a launcher.

Every bad input is caught by :func:`precheck` before Hydra creates a run directory or any process starts,
and is reported as one line on stderr with exit status 2. That includes a run on GPUs whose estimated
memory per GPU (``hpctrain plan``) does not fit: ``plan_check=false`` submits it anyway. This module must not
import torch.

A user's project works from its own folder: ``python -m hpctrain --config-dir conf model=cnn`` adds
``conf/`` to Hydra's search path (the precheck, the single run, sweeps and ``--cfg`` alike), and the folder
the command was typed in is recorded as the submit directory (:data:`hpctrain.launch.project.PROJECT_DIR_ENV`)
so that every worker can import the user's package (:mod:`hpctrain.launch.project`).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from omegaconf import DictConfig

from hpctrain.config.schema import SLURM_ARRAY_LAUNCHER, Config
from hpctrain.errors import ConfigError
from hpctrain.models.spec import model_spec

EXIT_BAD_CONFIG = 2


def run(name: str, argv: list[str]) -> int:
    """``hpctrain [train] OVERRIDES...``: compose, check, launch (Hydra's flags work as usual)."""
    return train(argv)


def train(argv: list[str]) -> int:
    from hydra._internal.utils import get_args_parser

    from hpctrain.cli.common import user_config_dirs
    from hpctrain.launch.project import record_project_dir

    args = get_args_parser().parse_intermixed_args(argv)
    informational = args.help or args.hydra_help or args.info or args.shell_completion
    overrides = list(args.overrides)
    try:
        config_dirs = user_config_dirs(args.config_dir)
    except ConfigError as err:
        print(f"hpctrain: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    nesting = [o for o in overrides if o.lstrip("+~").startswith("hydra/launcher=submitit")]
    if nesting:  # each member would be a job that submits a job of its own
        print(
            f"hpctrain: {nesting[0].lstrip('+~')}: hydra-submitit-launcher would submit jobs that submit "
            "jobs again (valid: leave hydra/launcher out: -m with a Slurm cluster profile is one job "
            "array, dry_run included)",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    record_project_dir()
    if not informational:
        try:
            first, composed = precheck(overrides, multirun=args.multirun, config_dirs=config_dirs)
        except ConfigError as err:
            if args.cfg:  # --cfg: the config as composed, even when it is invalid, then what is wrong
                _print_composed(overrides, config_dirs, args.cfg)
            user_traceback = getattr(err, "user_traceback", None)  # the user's own code raised: show where
            if user_traceback:
                print(user_traceback, file=sys.stderr, end="")
            print(f"hpctrain: {err}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        if not (args.multirun or args.cfg or args.package or args.resolve or args.experimental_rerun):
            if first.dry_run:
                from hpctrain.cli.measured import measured_for
                from hpctrain.cli.plan import summary
                from hpctrain.plan.estimate import estimate

                try:  # a user's model: measured by the precheck already (cached), else now
                    est = estimate(first, measured_for(first))
                except ConfigError as err:
                    print(f"hpctrain: {err}", file=sys.stderr)
                    return EXIT_BAD_CONFIG
                print(summary(first, est), flush=True)  # the memory and time plan, one line
                return _dry_run(first, composed)
            return _run_single(composed, config_dirs)
        if args.multirun and first.dry_run and not args.cfg:
            from hpctrain.config.redact import secret_env

            members = sweep_members(overrides)
            if len(members) > 0 and not _interval_sweep(overrides):  # a grid: listed without Hydra's run
                where = "a job array" if first.cluster.kind == "slurm" else "one after another here"
                sweep_dir = Path(composed.hydra.sweep.dir).absolute()
                print(f"Dry run: nothing started. {len(members)} members would run ({where}) in {sweep_dir}:")
                secrets = secret_env(first.cluster.env)
                for i, member in enumerate(members):
                    line = " ".join(member)
                    for value in secrets.values():  # a secret cluster.env value is never printed
                        line = line.replace(value, "***")
                    print(f"  {i}  {line}")
                return 0
        chose_launcher = any(o.lstrip("+~").startswith("hydra/launcher=") for o in overrides)
        if args.multirun and first.cluster.kind == "slurm" and not chose_launcher:
            overrides.append(f"hydra/launcher={SLURM_ARRAY_LAUNCHER}")
    flags = [a for a in argv if a not in args.overrides]
    return _run_hydra([*flags, *overrides])


def _print_composed(overrides: list[str], config_dirs: list[Path], which: str) -> None:
    """``--cfg job|hydra|all`` for a config that composes but does not validate (nothing when it cannot
    even be composed: the error line says why)."""
    from omegaconf import OmegaConf

    from hpctrain.config.compose import compose

    try:
        cfg = compose(overrides, config_dirs)
    except ConfigError:
        return
    job = OmegaConf.create({k: cfg[k] for k in cfg if k != "hydra"})
    hydra = OmegaConf.create({"hydra": cfg.hydra})
    parts = {"job": [job], "hydra": [hydra], "all": [hydra, job]}[which]
    for part in parts:
        print(OmegaConf.to_yaml(part, resolve=False), end="", flush=True)


def precheck(
    overrides: list[str], multirun: bool, config_dirs: list[Path] | None = None
) -> tuple[Config, DictConfig]:
    """Compose and validate every run the command would start; raise ConfigError for the first bad one.
    Returns the first run's config, typed and as composed (with Hydra's node). ``config_dirs``: the
    user's ``--config-dir``."""
    from hpctrain.config.compose import compose, shadowed_choices, to_typed
    from hpctrain.config.validate import check_writable_dir
    from hpctrain.plan.check import check_run, data_for_model

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
        _probe_once(typed, probed)
        if typed.plan_check and (typed.cluster.gpus_per_node > 0 or typed.cluster.kind == "local"):
            # A user's model (no declared shapes) is measured first: imports torch, once per distinct model.
            from hpctrain.cli.measured import measured_for
            from hpctrain.cli.plan import check_fits, check_fits_here

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
    if first.cluster.kind == "slurm":  # a project too big to snapshot is refused before anything is written
        from hpctrain.launch.project import project_dir
        from hpctrain.launch.snapshot import plan_project

        plan_project(project_dir(), first.cluster.snapshot_paths)
    return checked[0]


def _check_unlocked(run_dir: Path) -> None:
    """Refuse, before Hydra writes anything there, a run directory another live run holds."""
    from hpctrain.rundir import RunDir, RunLock

    if RunDir(run_dir).lock.is_file():
        RunLock(run_dir).acquire().release()


def sweep_members(overrides: list[str]) -> list[list[str]]:
    """The override lists of a basic-sweeper grid. Interval sweeps (Optuna & co) cannot be enumerated ahead:
    they are left out here and each trial is validated when it starts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    axes: list[list[str]] = []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as err:  # Hydra's grammar errors: one line, like compose's
            reason = str(err).splitlines()[0]
            raise ConfigError("", None, f"cannot parse override '{text}': {reason}") from None
        key = override.get_key_element()
        if override.is_interval_sweep():
            continue
        if override.is_sweep_override():
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([override.input_line])
    return [list(combo) for combo in itertools.product(*axes)]


def _interval_sweep(overrides: list[str]) -> bool:
    """Whether a sweeper chooses the members as it goes (``interval(...)``: Optuna and the like)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return any(parser.parse_override(o).is_interval_sweep() for o in overrides)


def _probe_once(cfg: Config, probed: set[str]) -> None:
    """Try the user's model, data and loss on the meta device (hpctrain.train.probe), once per distinct
    combination of a sweep. Imports torch, but only for runs that bring their own code."""
    from hpctrain.train.probe import needs_probe

    key = repr((cfg.model, cfg.data, cfg.loss, cfg.trainer.seed))
    if not needs_probe(cfg) or key in probed:
        return
    from hpctrain.train.probe import probe

    probe(cfg)
    probed.add(key)


def _run_single(cfg: DictConfig, config_dirs: list[Path]) -> int:
    """One run from the config the precheck composed, through Hydra's own ``run_job`` (output directory,
    logging, .hydra/ files, callbacks), sparing the two further compositions ``hydra.main`` would make:
    submitting from a login node should take about a second."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    from hpctrain.config.compose import config_context

    try:
        from hydra._internal.callbacks import Callbacks
    except ImportError:  # Hydra moved it in 1.4
        from hydra.core.callbacks import Callbacks  # type: ignore[no-redef]

    with open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
    callbacks = Callbacks(cfg)
    with config_context(config_dirs):
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        callbacks.on_run_start(config=cfg, config_name="config")
        result = run_job(_task, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
        callbacks.on_run_end(config=cfg, config_name="config", job_return=result)
    _ = result.return_value  # re-raises what the task raised
    return 0


def _dry_run(typed: Config, cfg: DictConfig) -> int:
    """Print the plan and the rendered submission; create no directory and no file (Hydra's ``run_job``
    would make the run directory and its .hydra/ files)."""
    import logging

    from hydra.core.hydra_config import HydraConfig

    from hpctrain.launch import get_launcher

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # no log file either
    HydraConfig.instance().set_config(cfg)  # what the launchers read of Hydra's node; nothing written
    return int(get_launcher(typed).launch(typed, Path(cfg.hydra.run.dir).absolute()) or 0)


def _run_hydra(argv: list[str]) -> int:
    import hydra

    from hpctrain.config.compose import CONF_DIR
    from hpctrain.config.schema import register_configs

    register_configs()
    sys.argv = [sys.argv[0] if sys.argv else "hpctrain", *argv]
    app = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_task)
    app()
    return 0


def _task(cfg) -> float | None:  # type: ignore[no-untyped-def]  # Hydra passes a DictConfig
    from hydra.core.hydra_config import HydraConfig

    from hpctrain.config.compose import to_typed
    from hpctrain.config.redact import redact_files
    from hpctrain.launch import get_launcher, write_run_config
    from hpctrain.plan.check import check_run
    from hpctrain.rundir import RunLock

    run_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    try:
        typed = to_typed(cfg)
        check_run(typed)
        # A local run is one process tree: the launcher holds the run directory's lock for the run's life
        # (a Slurm job's rank 0 takes it in hpctrain.worker).
        lock = RunLock(run_dir).acquire() if typed.cluster.kind == "local" else None
    except ConfigError as err:  # a sweep trial the precheck could not enumerate (interval sweeps)
        print(f"hpctrain: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_CONFIG) from None
    # Hydra recorded the overrides (and so any secret cluster.env value) in .hydra/ and multirun.yaml.
    redact_files([*(run_dir / ".hydra").glob("*.yaml"), run_dir.parent / "multirun.yaml"], typed.cluster.env)
    try:
        write_run_config(run_dir, cfg)
        status = get_launcher(typed).launch(typed, run_dir)
    finally:
        if lock is not None:
            lock.release()
    if status:
        raise SystemExit(status)
    if typed.cluster.kind == "local":  # a sweeper that chooses trials from results (Optuna) reads it
        from hpctrain.launch.array import final_objective

        return final_objective(run_dir)
    return None
