"""The user's project folder (hpctrain.launch.project): its code reaches every local worker after hpctrain's
own path entry."""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.launch.project import package_path_entry, worker_pythonpath


def test_local_workers_get_the_project_after_hpctrain(tmp_path: Path):
    path = worker_pythonpath(tmp_path, "/else:/where").split(os.pathsep)
    assert path[-3:] == [str(tmp_path), "/else", "/where"]
    assert str(package_path_entry()) in path  # this checkout is no site-packages directory
    assert path.index(str(package_path_entry())) < path.index(str(tmp_path))
    assert worker_pythonpath(tmp_path, None, first=[Path("/a")]) == os.pathsep.join(["/a", str(tmp_path)])
