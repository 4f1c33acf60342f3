"""One fork server per node and job step, shared by the node's Slurm tasks. No torch import here.

Each Slurm task's restart agent (:mod:`hpctrain.launch.agent`) forks its worker from a fork server
(:mod:`hpctrain.launch.forked`) that imported torch once. A server per task still imports torch once per task:
8 GPUs on a node were 8 interpreters importing torch from the shared file system at the same moment (~4 CPU-s
each on the test machine, the larger part of a small job's CPU). The node's first task (``SLURM_LOCALID`` 0)
starts the server and lets it listen at a node-local socket named for the job start, the step and the host;
the node's other tasks join it there and send it their own requests (their environment, CPU affinity, limits
and descriptors: :func:`hpctrain.launch.forkwire.launcher_state`), so each worker is still what its own task
would have started.

Lifetime: the server dies with the first task's agent (its parent-death signal) and, when that agent ends
normally, ends once the last joined task has hung up (the agent waits for it, so a task's worker is never
killed because a neighbour finished first). A task that cannot join (no socket within :data:`JOIN_WAIT_S`, a
server that will not answer, of other code, or gone) starts a server of its own, as before; a worker whose
shared server died is reported as killed, and the next start uses a server of its own. The socket lives in a
directory only this user can enter (the server also checks each connection's uid), under ``$TMPDIR``
(node-local on a cluster; the test cluster's nodes share /tmp, hence the host in the name).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOIN_WAIT_S = 20.0  # Slurm starts a node's tasks together: the first one's server is a moment away
SOCKET_PATH_MAX = 100  # sockaddr_un holds 108 bytes with the terminating NUL


def socket_path(env: Mapping[str, str], job_start: str, host: str) -> str | None:
    """Where this node's tasks of one job step meet their fork server; None where they cannot share one
    (not a Slurm step, or no private directory for the socket)."""
    if env.get("SLURM_LOCALID") is None or env.get("SLURM_STEP_ID") is None:
        return None
    base = Path(tempfile.gettempdir()) / f"hpctrain-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = base.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # someone else's, or one others may enter: no socket of ours there
    path = str(base / f"fs-{job_start}.{env['SLURM_STEP_ID']}-{host}.sock")
    return path if len(path) <= SOCKET_PATH_MAX and "/" not in host else None


def node_server(env: Mapping[str, str], job_start: str, host: str, share: bool = True) -> Any:
    """This task's fork server: the node's shared one (started here by the node's first task, joined by the
    others; ``share=False``: one of its own), or None: its workers start as fresh interpreters. Shielded from
    Slurm's signals (see :mod:`hpctrain.forkserver.serve`). Never one named by an inherited
    HPCTRAIN_FORKSERVER: that is the submitting machine's (sbatch exports the submitter's environment)."""
    from hpctrain.launch.forked import FORKSERVER_ENV, ForkServer, ForkServerError, supported

    if not supported():
        return None
    path = socket_path(env, job_start, host) if share else None
    if path is not None and env.get("SLURM_LOCALID") != "0":
        joined = _join(path)
        if joined is not None:
            return joined
        path = None  # a server of our own, shared with no one
    own_env = {k: v for k, v in env.items() if k != FORKSERVER_ENV}
    server = ForkServer.start({**own_env, "HPCTRAIN_FORKSERVER_SHIELD": "1"}, share=path)
    try:
        server.ready()
    except ForkServerError as err:  # the workers start as fresh interpreters instead
        server.close()
        log.warning("No fork server on this node (%s): workers start as fresh interpreters", err)
        return None
    return server


def _join(path: str) -> Any:
    """The node's shared server at ``path``, once it answers; None when it does not come or will not do."""
    from hpctrain.errors import ConfigError
    from hpctrain.launch.forked import ForkServer, ForkServerError

    deadline = time.monotonic() + JOIN_WAIT_S
    refused_since: float | None = None
    while True:
        now = time.monotonic()
        if os.path.exists(path):
            try:
                server = ForkServer.connect(path)
                break
            except ConfigError:  # bound but not yet listening (a moment), or the server has ended
                refused_since = now if refused_since is None else refused_since
                if now - refused_since > 1.0:
                    log.warning("The node's fork server at %s has ended: this task starts its own", path)
                    return None
        if now >= deadline:
            log.warning("The node's fork server did not come to %s: this task starts its own", path)
            return None
        time.sleep(0.05)
    try:
        server.ready()
    except ForkServerError as err:
        server.close()
        log.warning("Not joining the node's fork server (%s): this task starts its own", err)
        return None
    return server
