"""The fork server's wire, shared by the launcher (:mod:`hpctrain.launch.forked`) and the server
(:mod:`hpctrain.forkserver`): messages, which hpctrain a server holds, what a request carries of the launcher.

A Unix stream socket carries length-prefixed JSON messages; file descriptors (a rank's log, the console)
travel beside a message as SCM_RIGHTS ancillary data, counted by the message's ``nfds``. Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import hpctrain
from hpctrain.launch.project import package_path_entry

_HEADER = struct.Struct("!I")
_MAX_MESSAGE = 64 << 20
# What a child's rlimits copy from the launcher (the spawned path inherits them all; these are the ones a
# training process can notice).
LIMITS = ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NPROC",
          "RLIMIT_MEMLOCK")  # fmt: skip


class ForkServerError(RuntimeError):
    """A fork server that cannot serve this launch; ``str()`` is one line."""


class ServerGone(ForkServerError):
    """The server's connection closed while children it started were still running."""


class ServerMismatch(ForkServerError):
    """A server started from other hpctrain code than this process's (another checkout, version, Python, or
    sources changed since it started)."""


# --- the wire ---------------------------------------------------------------------------------------------


def send_message(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """One message; ``fds`` travel with its first byte (the receiver takes ``message["nfds"]`` of them)."""
    data = json.dumps({**message, "nfds": len(fds)}).encode()
    payload = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [payload], list(fds)) if fds else 0
    sock.sendall(payload[sent:])


class MessageReader:
    """Reassembles messages (and their descriptors) from a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._fds: list[int] = []

    def feed(self) -> bool:
        """One receive (call when the socket is readable); False at end of stream."""
        data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 16, socket.MSG_CMSG_CLOEXEC)
        self._fds.extend(fds)
        self._buf += data
        return bool(data)

    def messages(self) -> Iterator[tuple[dict[str, Any], list[int]]]:
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > _MAX_MESSAGE:
                raise ForkServerError(f"a fork server message of {size} bytes (at most {_MAX_MESSAGE})")
            if len(self._buf) < _HEADER.size + size:
                return
            message = json.loads(bytes(self._buf[_HEADER.size : _HEADER.size + size]))
            del self._buf[: _HEADER.size + size]
            count = int(message.get("nfds", 0))
            fds, self._fds = self._fds[:count], self._fds[count:]
            yield message, fds

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


# --- which hpctrain a server holds ------------------------------------------------------------------------


def identity() -> dict[str, str]:
    """What a server must share with its clients: hpctrain's version and path entry, the Python, and a
    fingerprint of hpctrain's sources (their names, sizes and modification times)."""
    package = Path(hpctrain.__file__).resolve().parent
    digest = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        info = path.stat()
        digest.update(f"{path.relative_to(package)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return {
        "version": hpctrain.__version__,
        "package": str(package_path_entry()),
        "python": sys.executable,
        "sources": digest.hexdigest(),
    }


def mismatch(theirs: Mapping[str, str], ours: Mapping[str, str]) -> str | None:
    for key, what in (("package", "hpctrain from"), ("version", "hpctrain"), ("python", "Python")):
        if theirs.get(key) != ours[key]:
            return f"it runs {what} {theirs.get(key)}, this is {what} {ours[key]}"
    if theirs.get("sources") != ours["sources"]:
        return "hpctrain's sources changed since it started (restart it to fork the new code)"
    return None


ROOM_ENV = "HPCTRAIN_FORKSERVER_ROOM"


def room_args() -> list[str]:
    """Arguments that reserve room in a server's command line, which each child rewrites into its own
    (``python -m hpctrain.worker RUN_DIR``, what ``ps`` and /proc/PID/cmdline show of a spawned worker)."""
    return ["--room", "." * 4096]


def room_env() -> dict[str, str]:
    """A variable that reserves room in a server's environment block, which each child rewrites into its own
    environment (what /proc/PID/environ shows of a spawned worker); the server drops it from os.environ."""
    return {ROOM_ENV: "." * 16384}


def launcher_state() -> dict[str, Any]:
    """What a spawned worker would inherit from this process besides its environment and cwd: umask,
    signal mask and ignored signals, resource limits, CPU affinity and niceness."""
    import resource

    umask = os.umask(0o022)
    os.umask(umask)
    # subprocess restores SIGPIPE and SIGXFSZ before exec and Python ignores them again at start: those two
    # are the child's own business. Handlers Python installed become SIG_DFL at exec.
    python_own = {signal.SIGPIPE, signal.SIGXFSZ}
    ignored = [int(s) for s in signal.valid_signals() if s not in python_own and _ignored(s)]
    return {
        "umask": umask,
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "ignored": ignored,
        "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
        "affinity": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


def _ignored(sig: int) -> bool:
    try:
        return signal.getsignal(sig) == signal.SIG_IGN
    except (OSError, ValueError):
        return False
