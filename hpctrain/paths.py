"""Where hpctrain keeps what is not a run's: the user's cache (rehearsal records, the shared Slurm watch).

``$HPCTRAIN_CACHE``, else ``$XDG_CACHE_HOME/hpctrain``, else ``~/.cache/hpctrain``. Nothing in it is needed
to resume a run: removing it costs a rehearsal or a query again, never a result.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HPCTRAIN_CACHE"


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpctrain"
