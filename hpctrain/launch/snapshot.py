"""Freeze the code a job will run: the ``hpctrain`` package (with its conf/) and the user's project, as they
are at submit time.

A queued job may start hours later; if it imported the code from the working tree then, an edit made
meanwhile would change what it runs. The job puts the snapshot on its PYTHONPATH instead: ``RUN_DIR/code``
(holding ``hpctrain/``) first, then the user's project copy ``RUN_DIR/code/project/<subdir>``.

What of the user's project (the submit directory, :mod:`hpctrain.launch.project`) is copied
(:func:`plan_project`):

- ``cluster.snapshot_paths`` when given: those files and folders, relative to the submit directory;
- else, inside a git repository, its tracked files (``git ls-files`` from the repository's top, with their
  layout; ``<subdir>`` is the submit directory's place in the repository);
- else the ``*.py`` files and packages directly under the submit directory (not outputs/, multirun/,
  hidden folders or __pycache__).

Nothing is copied when the submit directory's code root is a checkout of hpctrain itself (its package
snapshot is already there). A project snapshot over :data:`PROJECT_LIMIT_BYTES` is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import hpctrain
from hpctrain.errors import ConfigError
from hpctrain.rundir import RunDir

PROJECT_LIMIT_BYTES = 200 * 1000 * 1000
_SKIPPED_DIRS = {"outputs", "multirun", "__pycache__"}


@dataclass(frozen=True)
class ProjectSnapshot:
    """The files of the user's project a job's snapshot holds: ``files`` relative to ``root``; ``subdir``
    is the submit directory relative to ``root`` (``""`` when they are the same)."""

    root: Path
    files: tuple[str, ...]
    subdir: str
    size: int


def _stray_bytecode(folder: str, names: list[str]) -> set[str]:
    """What copytree leaves out: a ``.pyc`` beside the sources rather than in ``__pycache__`` (Python 2's
    place for it, or a sourceless module), which would be imported whatever its source says."""
    return set() if Path(folder).name == "__pycache__" else {n for n in names if n.endswith(".pyc")}


def snapshot_package(destination_root: Path) -> Path:
    """Copy the package into ``destination_root/code/hpctrain``; return the directory for PYTHONPATH."""
    source = Path(hpctrain.__file__).resolve().parent
    target_root = RunDir(destination_root).code
    target = target_root / "hpctrain"
    if target.exists():
        shutil.rmtree(target)
    # symlinks=False: the top-level conf -> hpctrain/conf link style must not leak into the snapshot. The
    # package's compiled bytecode comes along (__pycache__): each task of the job would otherwise compile
    # the modules it imports (~0.25 CPU-s a process here). copytree keeps the sources' modification times,
    # which each .pyc is checked against, so one that does not match its source is compiled again.
    shutil.copytree(source, target, ignore=_stray_bytecode)
    return target_root


def plan_project(project: Path, snapshot_paths: Sequence[str] = ()) -> ProjectSnapshot | None:
    """What :func:`snapshot_project` would copy of the project in ``project`` (None: nothing, for a checkout
    of hpctrain); raises ConfigError for a missing snapshot path or a snapshot over the size limit."""
    project = project.resolve()
    top = _git_top(project) if not snapshot_paths else None
    root = top or project
    if (root / "hpctrain").resolve() == Path(hpctrain.__file__).resolve().parent:
        return None  # a checkout of hpctrain itself: the package snapshot is the code
    if snapshot_paths:
        files = sorted(_listed_files(project, snapshot_paths))
    elif top is not None:
        files = _git_files(top)
    else:
        files = sorted(_default_files(project))
    size = sum((root / f).stat().st_size for f in files)
    if size > PROJECT_LIMIT_BYTES:
        raise ConfigError(
            "cluster.snapshot_paths",
            list(snapshot_paths),
            f"the code snapshot of {root} would be {size / 1e6:.0f} MB, over the"
            f" {PROJECT_LIMIT_BYTES / 1e6:.0f} MB limit",
            valid="list just the code the job needs, e.g. cluster.snapshot_paths=[mynets]",
        )
    subdir = "" if root == project else project.relative_to(root).as_posix()
    return ProjectSnapshot(root, tuple(files), subdir, size)


def snapshot_project(plan: ProjectSnapshot | None, destination_root: Path) -> Path | None:
    """Copy the planned files into ``destination_root/code/project/``; return the PYTHONPATH entry for the
    submit directory's copy (None when there is no plan)."""
    if plan is None:
        return None
    target = RunDir(destination_root).code_project
    if target.exists():
        shutil.rmtree(target)
    for name in plan.files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(plan.root / name, target / name)
    entry = project_path_entry(plan, destination_root)
    entry.mkdir(parents=True, exist_ok=True)
    return entry


def project_path_entry(plan: ProjectSnapshot | None, destination_root: Path) -> Path | None:
    """Where the submit directory's copy is (or will be) in the snapshot under ``destination_root``."""
    if plan is None:
        return None
    target = RunDir(destination_root).code_project
    return target / plan.subdir if plan.subdir else target


def _git_top(project: Path) -> Path | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(project), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:  # no git here
        return None
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None


def _git_files(top: Path) -> list[str]:
    done = subprocess.run(
        ["git", "-C", str(top), "ls-files", "-z"], capture_output=True, text=True, check=True
    )
    # Tracked files only; one deleted from the working tree, or a submodule (a folder), is not copied.
    return sorted(name for name in done.stdout.split("\0") if name and (top / name).is_file())


def _listed_files(project: Path, paths: Sequence[str]) -> Iterator[str]:
    for entry in paths:
        path = project / entry
        if path.is_file():
            yield path.relative_to(project).as_posix()
        elif path.is_dir():
            yield from _walk(project, path)
        else:
            raise ConfigError(
                "cluster.snapshot_paths",
                entry,
                f"no such file or folder in {project}",
                valid="paths relative to it",
            )


def _default_files(project: Path) -> Iterator[str]:
    for path in sorted(project.iterdir()):
        if path.name.startswith(".") or path.name in _SKIPPED_DIRS:
            continue
        if path.is_file() and path.suffix == ".py":
            yield path.name
        elif path.is_dir() and (path / "__init__.py").is_file():
            yield from _walk(project, path)


def _walk(project: Path, folder: Path) -> Iterator[str]:
    for parent, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".pyc") and (Path(parent) / name).is_file():
                yield (Path(parent) / name).relative_to(project).as_posix()
