"""``hpctrain [train] [OVERRIDES...]``: compose a run with Hydra, check it, hand it to a launcher.

Every bad input is caught by :mod:`hpctrain.submit.precheck` before Hydra creates a run directory or any
process starts, and is reported as one line on stderr with exit status 2. That includes a run on GPUs
whose estimated memory per GPU (``hpctrain plan``) does not fit: ``plan_check=false`` submits it anyway.
This module must not import torch.

A user's project works from its own folder: ``python -m hpctrain --config-dir conf model=cnn`` adds
``conf/`` to Hydra's search path (the precheck, the single run, sweeps and ``--cfg`` alike), and the folder
the command was typed in is recorded as the submit directory (:data:`hpctrain.launch.project.PROJECT_DIR_ENV`)
so that every worker can import the user's package (:mod:`hpctrain.launch.project`).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from hpctrain.config.schema import SLURM_ARRAY_LAUNCHER
from hpctrain.errors import EXIT_BAD_CONFIG, ConfigError

# Hydra's refusal of a sweep's value without --multirun: a comma list ("Ambiguous value ...", whose hint
# is on its later lines) or a sweep function such as range() ("... requires --multirun").
_SWEEP_WITHOUT_M = re.compile(r"(?:Ambiguous value for argument|Sweep parameters) '(.+)'")


def run(name: str, argv: list[str]) -> int:
    """``hpctrain [train] OVERRIDES...``: compose, check, launch (Hydra's flags work as usual)."""
    return train(argv)


def train(argv: list[str]) -> int:
    from hpctrain.launch import forked

    forked.prestart(argv)  # a local run's fork server imports torch while Hydra composes the run
    try:
        return _train(argv)
    finally:
        forked.stop_prestarted()


def one_process(overrides: list[str]) -> list[str]:
    """``parallel=none`` is one process (docs/parallelism.md's table): a local run's default of 2 processes
    would refuse it, so it comes with ``cluster.nproc=1`` unless nproc was typed (then a mismatch is refused,
    naming both). A Slurm profile's world is its nodes × tasks_per_node, which nproc does not change."""
    keys = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    if "parallel=none" in overrides and "cluster.nproc" not in keys:
        return [*overrides, "cluster.nproc=1"]
    return overrides


def _unknown_command(argv: list[str], overrides: list[str]) -> str | None:
    """``hpctrain trian``: a first word that looks like a subcommand (no ``=``, no ``+``/``~``, a plain
    word) is answered as one, not as an override Hydra cannot parse; None for anything else."""
    import difflib
    import re

    from hpctrain.cli import SUBCOMMANDS

    if not argv or not overrides or argv[0] != overrides[0]:
        return None
    word = argv[0]
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", word):
        return None
    close = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1)
    valid = f"valid: {', '.join(SUBCOMMANDS)}, or KEY=VALUE overrides"
    hint = f"did you mean {close[0]}?" if close else valid
    return f"unknown command {word!r} ({hint})"


def _interval_without_sampler(overrides: list[str], composed: Any) -> ConfigError | None:
    """``-m optim.lr=interval(…)`` under Hydra's basic sweeper, which cannot sample a range (its traceback,
    after the sweep directory was made): the override and the sweeper that can, before anything is written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain.errors import pip_line
    from hpctrain.submit.sweep import SWEEPER_PACKAGES, chosen_sweeper

    if chosen_sweeper(composed) != "basic":
        return None
    parser = OverridesParser.create()
    for text in overrides:
        if parser.parse_override(text).is_interval_sweep():
            key, value = text.split("=", 1)
            plugin = pip_line(SWEEPER_PACKAGES["optuna"][0])
            why = "an interval needs a sweeper that samples (Hydra's basic sweeper lists a grid)"
            valid = f"hydra/sweeper=optuna ({plugin}), or a list of values: {key}=A,B,C"
            return ConfigError(key.lstrip("+~"), value, why, valid=valid)
    return None


def _as_typed(err: ConfigError, overrides: list[str]) -> ConfigError:
    """A refusal of the run directory (its lock held by another run) names ``run=NAME`` to someone who typed
    that, not ``hydra.run.dir``, which they never saw; any other refusal as it is."""
    sweep = _SWEEP_WITHOUT_M.match(err.reason) if not err.key else None
    if sweep is not None:  # Hydra's three-line answer, cut to its first line, lost its hint: keep it
        given = sweep.group(1)
        key, value = given.split("=", 1) if "=" in given else ("", given)
        ways = "add -m (--multirun) to sweep over it"
        if "," in value and "(" not in value:
            ways += f", {key}=[{value}] for a list, or quote it ('{key}=\"{value}\"') for a string"
        return ConfigError(key, value, "is a sweep, and the command has no -m", valid=ways)
    typed = {o.lstrip("+~").split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if "=" in o}
    if err.key != "hydra.run.dir" or "run" not in typed or "hydra.run.dir" in typed:
        return err
    valid = (err.valid or "").replace("a different hydra.run.dir", "another run= name")
    return ConfigError("run", typed["run"], f"its directory {err.value}: {err.reason}", valid=valid or None)


def _train(argv: list[str]) -> int:
    from hydra._internal.utils import get_args_parser

    from hpctrain.config.compose import user_config_dirs
    from hpctrain.launch import forked
    from hpctrain.launch.project import record_project_dir
    from hpctrain.submit.dry_run import list_dry_sweep, show_dry_run
    from hpctrain.submit.hydra_app import print_composed, run_hydra, run_single
    from hpctrain.submit.submission import precheck

    args = get_args_parser().parse_intermixed_args(argv)
    mistyped = _unknown_command(argv, list(args.overrides))
    if mistyped is not None:
        print(f"hpctrain: {mistyped}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    informational = args.help or args.hydra_help or args.info or args.shell_completion
    overrides = one_process(list(args.overrides))
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
                print_composed(overrides, config_dirs, args.cfg)
            user_traceback = getattr(err, "user_traceback", None)  # the user's own code raised: show where
            if user_traceback:
                print(user_traceback, file=sys.stderr, end="")
            print(f"hpctrain: {_as_typed(err, list(args.overrides))}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        if args.multirun:
            basic_interval = _interval_without_sampler(overrides, composed)
            if basic_interval is not None:
                print(f"hpctrain: {basic_interval}", file=sys.stderr)
                return EXIT_BAD_CONFIG
        local = first.cluster.kind == "local" and first.cluster.fork_server and not first.dry_run
        forked.keep_prestarted(local and not (args.cfg or args.package or args.resolve))
        if not (args.multirun or args.cfg or args.package or args.resolve or args.experimental_rerun):
            if first.dry_run:
                return show_dry_run(first, composed)
            return run_single(composed, config_dirs, first)
        if args.multirun and first.dry_run and not args.cfg:
            listed = list_dry_sweep(overrides, composed, first)
            if listed is not None:  # a grid or a sampler's sweep, said without Hydra's run
                return listed
        chose_launcher = any(o.lstrip("+~").startswith("hydra/launcher=") for o in overrides)
        if args.multirun and first.cluster.kind == "slurm" and not chose_launcher:
            overrides.append(f"hydra/launcher={SLURM_ARRAY_LAUNCHER}")
    flags = [a for a in argv if a not in args.overrides]
    return run_hydra([*flags, *overrides])
