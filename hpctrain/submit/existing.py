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
from hpctrain.rundir import HYDRA_DIR, LOCK_FILE, RUNS_ROOT, SUBMIT_LOG, SWEEPS_ROOT, RunDir
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
            "run", name, "not a run name",
            valid="1-100 letters, digits, '.', '_' or '-', from a letter or digit, e.g. run=gpt-small",
        )  # fmt: skip
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    ours = f"{key}={SWEEPS_ROOT if multirun else RUNS_ROOT}/{name}"
    if ours in overrides:
        return []
    given = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == key]
    if given:
        raise ConfigError(
            key, given[0].split("=", 1)[1], f"and run={name} both name the run's directory",
            valid=f"one of them: run={name} is {key}={SWEEPS_ROOT if multirun else RUNS_ROOT}/{name}",
        )  # fmt: skip
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
            "hydra.run.dir", str(run_dir), f"holds files that are not an hpctrain run ({shown})",
            valid="a new or empty folder, or an hpctrain run directory to continue (run=NAME: outputs/NAME)",
        )  # fmt: skip
    checkpoints = layout.committed(run.checkpoints)
    resume = cfg.trainer.resume
    if resume == "never" and (checkpoints or run.metrics.is_file()):
        what = f"checkpoints (newest: step {layout.step_of(checkpoints[0])})" if checkpoints else "metrics"
        raise ConfigError(
            "trainer.resume", "never", f"{run_dir} holds a run's {what}: a fresh start would write over them",
            valid="trainer.resume=auto to continue that run, or a new hydra.run.dir (run=NAME)",
        )  # fmt: skip
    if resume == "auto" and checkpoints:
        check_resumable(checkpoints[0], composed)
        check_kept_batch(checkpoints[0], cfg)
    elif resume not in ("auto", "never"):
        check_resumable(Path(resume), composed)


def check_resumable(checkpoint: Path, composed: DictConfig) -> None:
    """Refuse, before anything is written, a resume that changes what the checkpoint's run cannot change
    (its saved config.yaml against this command's); model shapes are checked when the checkpoint loads."""
    from hpctrain.config.io import run_config_text
    from hpctrain.config.resume import changes_between, first_refused

    saved_file = layout.config_copy(checkpoint)
    if not saved_file.is_file():
        return
    try:
        saved = OmegaConf.load(saved_file)
    except Exception:  # damaged: the trainer skips this checkpoint and says why
        return
    current = OmegaConf.create(run_config_text(composed))
    refused = first_refused(changes_between(saved, current))  # type: ignore[arg-type]
    if refused is not None:
        key, old, new = refused
        raise ConfigError(
            key, new, f"checkpoint {checkpoint} was trained with {key}={_show(old)}, which a resumed run "
            f"cannot change; {START_FRESH}",
        )  # fmt: skip


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
            "trainer.global_batch_size", None,
            f"unset, so the resume keeps {checkpoint.name}'s global batch of {saved}, which {err.reason}",
            valid="a trainer.micro_batch_size that splits it over the data-parallel ranks, or a "
            "trainer.global_batch_size of this run's",
        ) from None  # fmt: skip


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
