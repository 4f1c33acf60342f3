"""The user's project: the folder a run was submitted from, and how every worker imports its code.

``python -m hpctrain ...`` typed in a project folder (the user's package, e.g. ``mynets/``, beside its
``conf/``) makes that folder the *submit directory*: :func:`record_project_dir` puts its absolute path in
the environment variable ``HPCTRAIN_PROJECT_DIR``, which local workers inherit and a Slurm job script
exports. Workers import the user's package as ``python -m`` would from that folder, but after hpctrain's
own path entry, so a user module named like one of ours cannot shadow it:

- local workers: ``PYTHONPATH`` = hpctrain's path entry, then the submit directory
  (:func:`worker_pythonpath`);
- Slurm: ``PYTHONPATH`` = ``RUN_DIR/code`` (the package snapshot), then the project snapshot under
  ``RUN_DIR/code/project/`` (:mod:`hpctrain.launch.snapshot`); the job runs in the submit directory, so
  relative data paths in the user's config resolve as typed.
"""

from __future__ import annotations

import os
import site
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import hpctrain

PROJECT_DIR_ENV = "HPCTRAIN_PROJECT_DIR"


def record_project_dir() -> Path:
    """Record the current directory (absolute) as the submit directory, for this process and its children."""
    here = Path.cwd().absolute()
    os.environ[PROJECT_DIR_ENV] = str(here)
    return here


def project_dir() -> Path:
    """The submit directory: the recorded one, else the current directory."""
    recorded = os.environ.get(PROJECT_DIR_ENV)
    return Path(recorded) if recorded else Path.cwd().absolute()


def package_path_entry() -> Path:
    """The ``sys.path`` entry that holds the running ``hpctrain`` package (its parent directory)."""
    return Path(hpctrain.__file__).resolve().parent.parent


def worker_pythonpath(project: Path, existing: str | None, first: Sequence[Path] | None = None) -> str:
    """PYTHONPATH for a worker: ``first`` (default: hpctrain's own entry, unless that is a site-packages
    directory, which must stay behind the user's PYTHONPATH), then ``project``, then what was there before;
    each entry once, in that order."""
    if first is None:
        entry = package_path_entry()
        first = [] if _is_site_dir(entry) else [entry]
    entries = [str(p) for p in first] + [str(project)]
    entries += [e for e in (existing or "").split(os.pathsep) if e]
    return os.pathsep.join(dict.fromkeys(entries))


def _is_site_dir(path: Path) -> bool:
    sites = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    return any(Path(s).resolve() == path for s in sites if s)
