"""Runs as a whole, by their directories: the latest run under the current folder, the command that continues
one, taking away a run directory that never started (with the folders this command made for it), and whether
a run reached its end."""

from __future__ import annotations

from pathlib import Path

from hpctrain.rundir import (
    CODE_DIR,
    HYDRA_DIR,
    HYDRA_OVERRIDES,
    RUNS_ROOT,
    SBATCH_SCRIPT,
    SLURM_DIR,
    SWEEPS_ROOT,
    RunDir,
)


def latest_run(here: Path) -> Path:
    """The run directory under ``here/outputs`` or ``here/multirun`` whose metrics or config changed last
    (one Hydra made: it holds .hydra/overrides.yaml); a ConfigError naming both folders when none is."""
    from hpctrain.errors import ConfigError

    found: list[tuple[float, Path]] = []
    for root in (here / RUNS_ROOT, here / SWEEPS_ROOT):
        if not root.is_dir():
            continue
        # outputs/NAME, outputs/DATE/TIME, multirun/NAME/N, multirun/DATE/TIME/N: never into checkpoints
        found_here = [
            p
            for depth in (1, 2, 3)
            for p in root.glob("/".join(["*"] * depth + [HYDRA_DIR, HYDRA_OVERRIDES]))
        ]
        for config in found_here:
            run = RunDir(config.parent.parent)
            if not run.config.is_file():
                continue
            stamps = [p.stat().st_mtime for p in (run.metrics, run.config) if p.is_file()]
            found.append((max(stamps), run.path))
    if not found:
        raise ConfigError(
            "RUN_DIR",
            None,
            f"no run in {here / RUNS_ROOT} or {here / SWEEPS_ROOT}",
            valid="a run's directory",
        )
    return max(found)[1]


def continue_command(run_dir: Path) -> str:
    """The exact command that continues a run (printed by every stop), its path relative to the current
    folder when it is under it."""
    import shlex

    path = Path(run_dir).absolute()
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return f"hpctrain resume {shlex.quote(shown)}"


def first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` (itself or an ancestor) that does not exist yet: what creating
    ``path`` makes, and what removing a run that never started takes away. None when ``path`` exists."""
    path = Path(path).absolute()
    if path.exists():
        return None
    top = path
    while not top.parent.exists():
        top = top.parent
    return top


def remove_unstarted(run_dir: Path, made: Path | None, submission: bool = False) -> None:
    """Remove a run directory that never started (it holds only Hydra's records, see
    :meth:`RunDir.holds_only_records`), and the folders above it that this command created (``made``, from
    :func:`first_missing` before it ran) once they are empty. A directory that existed before is kept
    whole, only a failed submission's own snapshot and scripts are taken out of it."""
    import shutil

    run_dir = Path(run_dir).absolute()
    if not RunDir(run_dir).holds_only_records(submission):
        return
    if made is None:  # the directory was there before this command: take out only what it prepared
        if submission:
            for name in (CODE_DIR, SLURM_DIR):
                shutil.rmtree(run_dir / name, ignore_errors=True)
            (run_dir / SBATCH_SCRIPT).unlink(missing_ok=True)
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if made is None or (run_dir != made and made not in run_dir.parents):
        return
    parent = run_dir.parent
    while parent != made.parent and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def finished(run_dir: Path) -> bool:
    """Whether the run reached its end: ``trainer.max_steps`` (a script's: it ended without an error)."""
    run = RunDir(run_dir)
    if is_script(run_dir):
        return not run.error_files()
    total = run.max_steps()
    records = run.read_metrics(64 * 1024)
    step = records[-1].get("step", 0) if records else 0
    return total is not None and isinstance(step, int) and step >= total


def is_script(run_dir: Path) -> bool:
    """Whether the run is the user's own script (task=script), whose progress is not the trainer's."""
    from omegaconf import OmegaConf

    try:
        return str(OmegaConf.select(OmegaConf.load(RunDir(run_dir).config), "task.name")) == "script"
    except Exception:  # missing or unreadable: the trainer's
        return False
