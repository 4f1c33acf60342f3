"""What a run directory already holds, decided before Hydra writes into it. Torch-free.

A run directory is new or empty, a run this command continues (an hpctrain run whose newest checkpoint was
trained with a config this one may resume: :mod:`hpctrain.config.resume`), or refused in one line: a folder
of the user's own (their files, another tool's ``config.yaml``), another run's checkpoint folder, a run whose
checkpoints ``trainer.resume=never`` would write over, a resume that changes what cannot change. Nothing is
written or deleted on the way, so a refused command leaves the directory byte for byte as it was.

``run=NAME`` names the run: its directory is ``outputs/NAME`` (a sweep's ``multirun/NAME``), so the same
command again continues it (:func:`named_run_overrides`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hpctrain.config.schema import Config
from hpctrain.errors import START_FRESH, ConfigError
from hpctrain.rundir import (
    CHECKPOINTS_DIR,
    HYDRA_DIR,
    LOCK_FILE,
    RUNS_ROOT,
    SUBMIT_LOG,
    SWEEPS_ROOT,
    RunDir,
    objects,
)
from hpctrain.rundir import checkpoints as layout

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
HPCTRAIN_KEYS = ("model", "trainer", "cluster")  # a config.yaml holding these is an hpctrain run's
HYDRA_ONLY = {HYDRA_DIR, SUBMIT_LOG, LOCK_FILE}  # all a run that never started may have left


def named_run_overrides(name: str | None, overrides: list[str], multirun: bool) -> list[str]:
    """The override that puts a run named ``run=NAME`` in its stable directory (none when unnamed, or
    when ``overrides`` hold it already); a ConfigError for a name that is not one, or for a run directory
    given twice."""
    if name is None:
        return []
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            "run",
            name,
            "not a run name",
            valid="1-100 letters, digits, '.', '_' or '-', from a letter or digit, e.g. run=gpt-small",
        )
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    ours = f"{key}={SWEEPS_ROOT if multirun else RUNS_ROOT}/{name}"
    if ours in overrides:
        return []
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == key]
    if given:
        raise ConfigError(
            key,
            given[0].split("=", 1)[1],
            f"and run={name} both name the run's directory",
            valid=f"one of them: run={name} is {key}={SWEEPS_ROOT if multirun else RUNS_ROOT}/{name}",
        )
    return [ours]


def check_existing(run_dir: Path, cfg: Config, composed: DictConfig) -> None:
    """Refuse (one line) to run in ``run_dir`` unless it is new or empty, or a run this one continues."""
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise ConfigError("hydra.run.dir", str(run_dir), "is a file", valid="a folder for the run")
    entries = sorted(p.name for p in run_dir.iterdir())
    run = RunDir(run_dir)
    if set(entries) <= HYDRA_ONLY:
        return  # new, or what Hydra wrote for a run that never started
    if not _is_hpctrain_run(run):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(
            "hydra.run.dir",
            str(run_dir),
            f"holds files that are not an hpctrain run ({shown})",
            valid="a new or empty folder, or an hpctrain run directory to continue (run=NAME: outputs/NAME)",
        )
    check_same_store(run, cfg)
    checkpoints = layout.committed(run.shared_checkpoints)
    resume = cfg.trainer.resume
    if resume == "never" and (checkpoints or run.metrics.is_file()):
        what = f"checkpoints (newest: step {layout.step_of(checkpoints[0])})" if checkpoints else "metrics"
        raise ConfigError(
            "trainer.resume",
            "never",
            f"{run_dir} holds a run's {what}: a fresh start would write over them",
            valid="trainer.resume=auto to continue that run, or a new hydra.run.dir (run=NAME)",
        )
    if resume == "auto" and checkpoints:
        check_resumable(checkpoints[0], composed)
        check_kept_batch(checkpoints[0], cfg)
    elif resume not in ("auto", "never"):
        check_resumable(Path(resume), composed)


def check_same_store(run: RunDir, cfg: Config) -> None:
    """A run continues with its checkpoints where they are: ``checkpoint.path`` must name the store its
    ``checkpoints/store.json`` records (or none, when its checkpoints are in its folder), else it would
    start over without them, unseen."""
    recorded = objects.recorded_store(run.checkpoints)
    wanted = cfg.checkpoint.path
    if recorded is not None and recorded.url.rstrip("/") != (wanted or "").rstrip("/"):
        raise ConfigError(
            "checkpoint.path",
            wanted,
            f"{run.path}'s checkpoints are in {recorded.url} (checkpoints/{objects.STORE_RECORD}): "
            "this run would continue without them",
            valid=f"checkpoint.path={recorded.url}, or a new run (run=NAME)",
        )
    if recorded is None and wanted is not None and layout.committed(run.checkpoints):
        raise ConfigError(
            "checkpoint.path",
            wanted,
            f"{run.path}'s checkpoints are in its folder (checkpoints/): this run would go on without them",
            valid="checkpoint.path=null to continue it, or a new run (run=NAME) for the store",
        )


def check_resumable(checkpoint: Path, composed: DictConfig) -> None:
    """Refuse, before anything is written, a resume that changes what the checkpoint's run cannot change
    (its saved config.yaml against this command's); model shapes are checked when the checkpoint loads."""
    from hpctrain.config.io import run_config_text
    from hpctrain.config.resume import changes_between, first_refused

    saved_file = layout.config_copy(checkpoint)
    if not saved_file.is_file():
        return
    try:
        saved = OmegaConf.create(saved_file.read_text())  # a file, or an object of a store
    except Exception:  # damaged: the trainer skips this checkpoint and says why
        return
    current = OmegaConf.create(run_config_text(composed))
    refused = first_refused(changes_between(saved, current))  # type: ignore[arg-type]
    if refused is not None:
        key, old, new = refused
        raise ConfigError(
            key,
            new,
            f"checkpoint {checkpoint} was trained with {key}={_show(old)}, which a resumed run "
            f"cannot change; {START_FRESH}",
        )


def check_kept_batch(checkpoint: Path, cfg: Config) -> None:
    """A resume with ``trainer.global_batch_size`` unset keeps the checkpoint's global batch: it must split
    over this run's data-parallel ranks and micro-batches (a one-process run's 16 does not split into 2 ranks
    × 16), refused now in one line rather than in every worker."""
    import dataclasses

    from hpctrain.config.rules.run import check_batch

    saved = layout.read_manifest(checkpoint).get("global_batch_size")
    if cfg.trainer.global_batch_size is not None or not isinstance(saved, int):
        return
    kept = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, global_batch_size=saved))
    try:
        check_batch(kept)
    except ConfigError as err:
        raise ConfigError(
            "trainer.global_batch_size",
            None,
            f"unset, so the resume keeps {checkpoint.name}'s global batch of {saved}, which {err.reason}",
            valid="a trainer.micro_batch_size that splits it over the data-parallel ranks, or a "
            "trainer.global_batch_size of this run's",
        ) from None


def _is_hpctrain_run(run: RunDir) -> bool:
    """A run directory hpctrain wrote: its config.yaml is a run config (not a config of the user's), or it
    has Hydra's records and a run's files but no config yet (a run that never wrote one)."""
    if run.config.is_file():
        try:
            loaded = OmegaConf.load(run.config)
        except Exception:
            return False
        return isinstance(loaded, DictConfig) and all(key in loaded for key in HPCTRAIN_KEYS)
    return run.hydra.is_dir() and run.submit_log.is_file()


def _show(value: Any) -> str:
    return str(OmegaConf.to_container(value)) if isinstance(value, DictConfig) else str(value)


def check_not_in_checkpoint(key: str, path: Path) -> None:
    """Refuse a run or sweep directory that is, or lies inside, a checkpoint or a run's checkpoints folder:
    the run's config.yaml and logs written there would corrupt a committed checkpoint (it then fails its
    checksums) or read as a checkpoint of the run's."""
    found = layout.checkpoint_around(path)
    if found is None:
        return
    what = "a run's checkpoints folder" if found.name == CHECKPOINTS_DIR else "a checkpoint"
    where = "is" if found == Path(path).absolute() else f"is inside {found}:"
    raise ConfigError(
        key,
        str(path),
        f"{where} {what}, which only the checkpoint manager writes",
        valid="a folder of its own, e.g. run=NAME (outputs/NAME); to continue from that checkpoint: "
        f"trainer.resume={found}"
        if what == "a checkpoint"
        else "a folder of its own, e.g. run=NAME",
    )


# What a command may change when it continues a sweep (or one of its members) under the same name: where and
# how it runs, never what trained the members' weights (hyperparameters, model, data, the search space).
FREE_KEYS = (
    "run", "cluster", "logger", "dry_run", "plan_check", "rehearse", "trainer.resume", "data.num_workers",
    "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.run.dir", "hydra.job", "hydra.launcher", "hydra/launcher",
    "hydra.verbose", "hydra/job_logging", "hydra/hydra_logging", "hydra.output_subdir",
)  # fmt: skip


def _free(key: str) -> bool:
    return any(key == free or key.startswith((f"{free}.", f"{free}/")) for free in FREE_KEYS)


def _recipe(overrides: list[str]) -> dict[str, tuple[str, str]]:
    """{key: (value as Hydra reads it, as typed)} of the overrides that say what trains (not FREE_KEYS)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    found = {}
    for text in overrides:
        if text.startswith("-"):  # a flag of the command (--config-dir ...), not an override
            continue
        typed = text.partition("=")[2]
        try:
            override = parser.parse_override(text)
            key, value = override.key_or_group, "~" if override.is_delete() else repr(override.value())
        except Exception:  # not Hydra's grammar: compared as typed (compose refuses it in its own line)
            key, value = text.partition("=")[0].lstrip("+~"), typed
        if not _free(key):
            found[key] = (value, typed)
    return found


def changed_keys(old: list[str], new: list[str]) -> list[str]:
    """``key old → new`` for every key whose value differs between two commands' overrides (FREE_KEYS
    aside; ``(unset)`` for a key only one of them gives)."""
    before, after = _recipe(old), _recipe(new)
    changes = []
    for key in [*before, *(k for k in after if k not in before)]:
        was, now = before.get(key), after.get(key)
        if (was and was[0]) != (now and now[0]):
            changes.append(f"{key} {was[1] if was else '(unset)'} → {now[1] if now else '(unset)'}")
    return changes


def sweep_command(sweep_dir: Path) -> list[str] | None:
    """The command a sweep directory was made by: sweep.json's record of it, else the overrides Hydra's
    multirun.yaml holds (a grid); None when neither says."""
    from hpctrain.rundir.records import read_sweep

    try:
        record = read_sweep(sweep_dir)
    except (OSError, ValueError, TypeError, KeyError):
        record = None
    if record is not None and record.command is not None:
        return list(record.command)
    try:  # as typed: ${oc.env:NAME} (a secret's) is not resolved here
        task = OmegaConf.load(RunDir(sweep_dir).multirun).hydra.overrides.task
        return [str(o) for o in OmegaConf.to_container(task, resolve=False)]  # type: ignore[union-attr]
    except Exception:  # no multirun.yaml (a sampler's sweep), or unreadable
        return None


def _sweep_refusal(name: str | None, sweep_dir: Path, what: str, changes: list[str]) -> ConfigError:
    import shlex

    command = sweep_command(sweep_dir)
    if command is not None and name is not None:  # run=NAME names the directory again
        command = [c for c in command if not c.startswith(("hydra.sweep.dir=", "+hydra.sweep.dir="))]
    again = f"python -m hpctrain -m {shlex.join(command)}" if command else "the sweep's own command"
    shown = "; ".join(changes[:6]) + ("; ..." if len(changes) > 6 else "")
    return ConfigError(
        "run" if name is not None else "hydra.sweep.dir",
        name if name is not None else str(sweep_dir),
        f"sweep {sweep_dir} {what} other values ({shown}): its results belong to what trained them, and "
        "nothing of it was rewritten",
        valid=f"a new run=NAME for these values, or the sweep's own command to continue it: {again}",
    )


def check_sweep_reuse(sweep_dir: Path, overrides: list[str], name: str | None) -> None:
    """Refuse (one line, before Hydra writes anything) a sweep command whose directory holds a sweep made by
    a command with other values: its members' config, .hydra/, summary rows, sweep.json and the sweeper's
    results would be relabelled with values that never trained them. The same command continues it."""
    recorded = sweep_command(sweep_dir)
    if recorded is None:
        return
    changes = changed_keys(recorded, overrides)
    if changes:
        raise _sweep_refusal(name, sweep_dir, "was run with", changes)


def check_member_reuse(run_dir: Path, sweep_dir: Path, overrides: list[str], name: str | None) -> None:
    """Refuse a member of a sweep whose directory holds a member trained with other values (a sampler such as
    Optuna chose other trials this time): its weights were trained with those, and a new value is never
    honoured on them."""
    run = RunDir(run_dir)
    recorded = run.read_hydra_overrides()
    if recorded is None or not run.config.is_file():
        return
    changes = changed_keys(recorded, overrides)
    if changes:
        raise _sweep_refusal(name, sweep_dir, f"holds member {run_dir.name}, trained with", changes)


def own_recipe(overrides: list[str], multirun: bool) -> list[str]:
    """``run=NAME`` typed alone for a run that exists: the run's own recorded overrides (its recipe: a LoRA
    run's model.init_from and model.adapters, say), so that the command continues that run as it was
    trained rather than a run without them. Anything else: ``overrides`` unchanged."""
    from hpctrain.config.redact import REDACTED

    name = overrides[0].partition("=")[2] if len(overrides) == 1 and overrides[0].startswith("run=") else ""
    if multirun or not RUN_NAME.fullmatch(name) or name in (".", ".."):
        return overrides
    run = RunDir(Path(RUNS_ROOT) / name)
    recorded = run.read_hydra_overrides()
    if recorded is None or not run.config.is_file():
        return overrides
    dropped = ("run", "hydra.run.dir", "trainer.resume")
    kept = [o for o in recorded if o.lstrip("+~").split("=", 1)[0] not in dropped]
    for override in kept:
        if REDACTED in override.partition("=")[2]:  # recorded by an older hpctrain as ***
            key = override.lstrip("+~").partition("=")[0]
            raise ConfigError(
                key,
                REDACTED,
                f"run={name} continues its recipe, and this secret was never recorded: give it again",
                valid=f"run={name} {override.partition('=')[0]}=VALUE (or ${{oc.env:NAME}})",
            )
    return [*kept, f"run={name}"]
