"""Workers forked from a fork server, the launcher's side: which server, the connection, the process handles.

A fork server (:mod:`hpctrain.forkserver`, a separate process started by module name) imports torch and the
worker side once, then forks one child per request; each child becomes ``python -m hpctrain.worker RUN_DIR``
as a fresh interpreter would have started it (environment, cwd, sys.path, session, stdio, signals, random
state, threads). Starting a rank then costs a fork instead of an interpreter importing torch again (seconds
of CPU per rank). This module imports no torch: it only talks to the server.

Where the server comes from (:func:`server_for`):

- ``HPCTRAIN_FORKSERVER=/path/to.sock``: a server someone started with
  ``python -m hpctrain.forkserver --socket /path/to.sock`` (a workstation iterating on runs, the test
  suite). It runs the hpctrain code it imported when it started: one started from another checkout, another
  version or another Python, or one whose hpctrain sources changed since, is refused in one line and the
  workers start fresh instead.
- ``HPCTRAIN_FORKSERVER=off`` or ``cluster.fork_server=false``: no server, every worker is a fresh
  interpreter (:class:`subprocess.Popen`).
- otherwise one per launch, started by this process (the CLI starts it while Hydra composes the run:
  :func:`prestart`). It dies with this process (PDEATHSIG) and the children it forked die with it.

Kill semantics are the spawned path's: every child leads its own session (the launcher kills its process
group), the server SIGKILLs the children of a client whose connection closes (a killed launcher leaves no
workers), and a child's parent-death signal is bound to the server, whose pid the child sees as
``HPCTRAIN_LAUNCHER_PID``. A restarting agent (issue 27) keeps one :class:`ForkServer` and calls
:meth:`ForkServer.spawn` again for each restart. The wire, and what both sides share:
:mod:`hpctrain.launch.forkwire`.

Over 400 lines: the connection, the process handle and the choice of server (with the CLI's prestart that
feeds it) are one protocol's launcher side; the wire lives apart.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpctrain.errors import ConfigError
from hpctrain.launch.forkwire import (
    ForkServerError,
    MessageReader,
    ServerGone,
    ServerMismatch,
    identity,
    launcher_state,
    mismatch,
    room_args,
    room_env,
    send_message,
)

FORKSERVER_ENV = "HPCTRAIN_FORKSERVER"
OFF = "off"
SERVER_MODULE = "hpctrain.forkserver"
START_HINT = f"python -m {SERVER_MODULE} --socket PATH"
CONNECT_TIMEOUT_S = 120.0  # a server that has just started may still be importing torch


# --- the launcher's handle on a forked child --------------------------------------------------------------


class ForkedProcess:
    """What the launcher's supervision needs of a worker (``subprocess.Popen``'s pid, poll, wait and
    returncode, negative for a signal), fed by the exit status the server reports."""

    def __init__(self, server: ForkServer, request_id: int) -> None:
        self._server = server
        self.request_id = request_id
        self.pid = 0
        self.mode = ""  # "fork", or "exec: why" where a fork could not be what a fresh interpreter is
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"{SERVER_MODULE} child {self.pid}", timeout or 0.0)
            self._server.pump(left)
        return self.returncode


class ForkServer:
    """A connection to a fork server: one this process started (:meth:`start`) or a running one
    (:meth:`connect`). Not thread-safe; one launcher (or agent) drives it."""

    def __init__(
        self,
        sock: socket.socket,
        where: str,
        proc: subprocess.Popen[bytes] | None = None,
        shared: bool = False,
    ) -> None:
        self.sock = sock
        self.shared = shared  # others joined it (hpctrain.launch.nodeserver): close waits for them
        self.where = where  # for messages: "started by this launch" or "at PATH"
        self.proc = proc
        self.pid = proc.pid if proc is not None else 0
        self._reader = MessageReader(sock)
        self._procs: dict[int, ForkedProcess] = {}
        self._next_id = 0
        self._hello: dict[str, Any] | None = None
        self._gone = False
        send_message(sock, {"op": "hello"})

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None, share: str | None = None) -> ForkServer:
        """A server of this process's own: it lives until :meth:`close` or this process's death. ``share``:
        a socket path where other processes of this user may join it (:mod:`hpctrain.launch.nodeserver`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    SERVER_MODULE,
                    "--fd",
                    str(theirs.fileno()),
                    "--parent",
                    str(os.getpid()),
                    *(["--share", share] if share else []),
                    *room_args(),
                ],
                env={**(os.environ if env is None else env), **room_env()},
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a Ctrl-C at the terminal reaches the launcher only, as for workers
            )
        finally:
            theirs.close()
        where = "started by this launch" if share is None else f"shared at {share}"
        return cls(ours, where, proc, share is not None)

    @classmethod
    def connect(cls, path: str) -> ForkServer:
        """The server listening at ``path``; ForkServerError (one line) when there is none."""
        check_socket_path(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            raise ConfigError(
                FORKSERVER_ENV, path, f"no fork server answers there ({err.strerror or err})", valid=_VALID
            ) from None
        return cls(sock, f"at {path}")

    def gone(self) -> bool:
        """Has the server's connection closed (the server died, or ended)?"""
        if not self._gone:
            with contextlib.suppress(ForkServerError):
                self.pump(0.0)
        return self._gone

    def hello(self, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
        """The server's hello (it answers once its imports are done): its pid and :func:`identity`."""
        deadline = time.monotonic() + timeout
        while self._hello is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server {self.where} did not answer within {timeout:.0f} s")
            self.pump(left)
        return self._hello

    def ready(self, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
        """:meth:`hello`, and ServerMismatch for a server of other hpctrain code than this process's."""
        theirs = self.hello(timeout).get("identity", {})
        why = mismatch(theirs, identity())
        if why:
            raise ServerMismatch(f"not forking from the fork server {self.where}: {why}")
        return self.hello()

    def spawn(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_fd: int,
        console_fd: int | None = None,
        cwd: str | None = None,
    ) -> ForkedProcess:
        """Start ``python -m MODULE ARGS`` as a child of the server: ``env`` is its whole environment, its
        stdout and stderr go to ``log_fd``, ``console_fd`` (when given) is open in it under the number
        ``env["HPCTRAIN_CONSOLE_FD"]`` names. Returns once the server has forked it."""
        self.ready()
        self._next_id += 1
        handle = ForkedProcess(self, self._next_id)
        fds = [log_fd] if console_fd is None else [log_fd, console_fd]
        request = {
            "op": "spawn",
            "id": handle.request_id,
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": cwd or os.getcwd(),
            "console": None if console_fd is None else int(env["HPCTRAIN_CONSOLE_FD"]),
            **launcher_state(),
        }
        self._procs[handle.request_id] = handle
        try:
            send_message(self.sock, request, fds)
        except OSError:
            self._gone = True
            raise ServerGone(self._gone_message()) from None
        while not handle.pid:
            self.pump(None)
        return handle

    def pump(self, timeout: float | None) -> None:
        """Take in what the server said within ``timeout`` seconds (None: until it says something)."""
        while True:
            if self._gone:
                if any(p.returncode is None for p in self._procs.values()) or self._hello is None:
                    raise ServerGone(self._gone_message())
                return
            readable, _, _ = select.select([self.sock], [], [], timeout)
            if not readable:
                return
            try:
                alive = self._reader.feed()
            except OSError:
                alive = False
            for message, fds in self._reader.messages():
                for fd in fds:  # the server sends none; never leak one
                    os.close(fd)
                self._dispatch(message)
            if not alive:
                self._gone = True
                continue
            timeout = 0.0  # drain what else is there, then return

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "hello":
            self._hello = message
            self.pid = int(message["pid"])
        elif op == "started":
            handle = self._procs[int(message["id"])]
            handle.pid, handle.mode = int(message["pid"]), str(message.get("mode", "fork"))
        elif op == "exit":
            self._procs[int(message["id"])].returncode = int(message["returncode"])
        elif op == "error":
            raise ForkServerError(
                f"the fork server {self.where} could not start a worker: {message['message']}"
            )

    def _gone_message(self) -> str:
        pid = f" (pid {self.pid})" if self.pid else ""
        if self._hello is None:
            status = self.proc.poll() if self.proc is not None else None
            ended = "" if status is None else f" with exit status {status}"
            return f"the fork server{pid} {self.where} ended{ended} before it was ready"
        return f"the fork server{pid} {self.where} died; the workers it started died with it"

    def close(self) -> None:
        """Hang up: the server kills what is left of this connection's children (our own server exits; a
        shared one once the processes that joined it have hung up too, which this waits for)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self._reader.close()
        if self.proc is not None:
            if self._hello is None:  # still importing: it would read the hang-up only after that
                self.proc.terminate()
            try:
                self.proc.wait(timeout=None if self.shared and self._hello is not None else 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- which server a launch uses ---------------------------------------------------------------------------

_VALID = f"the socket of a running fork server ({START_HINT}), or {OFF}"
_prestarted: ForkServer | None = None
_told: set[str] = set()


def check_socket_path(path: str) -> None:
    """ConfigError (one line) unless ``path`` names a Unix socket."""
    if not path or any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise ConfigError(FORKSERVER_ENV, path, "not a socket path", valid=_VALID)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(FORKSERVER_ENV, path, "no such file", valid=_VALID) from None
    except OSError as err:
        raise ConfigError(FORKSERVER_ENV, path, f"cannot be read: {err.strerror}", valid=_VALID) from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(FORKSERVER_ENV, path, "not a socket", valid=_VALID)


def check_server_env() -> None:
    """For the precheck: a ``HPCTRAIN_FORKSERVER`` that names no live server is refused before anything is
    written (ConfigError); one of other hpctrain code is for the launch to tell of, as it starts workers."""
    value = os.environ.get(FORKSERVER_ENV)
    if value is None or value == OFF:
        return
    server = ForkServer.connect(value)
    try:
        server.hello()
    except ForkServerError as err:
        raise ConfigError(FORKSERVER_ENV, value, str(err), valid=_VALID) from None
    finally:
        server.close()


def server_for(fork_server: bool, env: Mapping[str, str] | None = None) -> tuple[ForkServer | None, bool]:
    """The server a launch forks its workers from, and whether the launch owns it (and closes it); None:
    start them as fresh interpreters. ``env``: a per-launch server's environment."""
    value = os.environ.get(FORKSERVER_ENV)
    if not fork_server or value == OFF or not supported():
        stop_prestarted()
        return None, False
    if value is not None:
        try:
            return _ready_at(value), True
        except ServerMismatch as err:
            _tell(str(err))
            return None, False
    server, owned = (_prestarted, False) if _prestarted is not None else (ForkServer.start(env), True)
    try:
        server.ready()
    except ForkServerError as err:  # our own could not start: the workers will say why, if they fail too
        if owned:
            server.close()
        else:
            stop_prestarted()
        _tell(str(err))
        return None, False
    return server, owned


def persistent_server() -> ForkServer | None:
    """A connection to the persistent server ``HPCTRAIN_FORKSERVER`` names, ready and of this checkout; None
    when none is set or it cannot serve (the launch says why, if it matters there)."""
    value = os.environ.get(FORKSERVER_ENV)
    if value is None or value == OFF or not supported():
        return None
    try:
        return _ready_at(value)
    except (ConfigError, ForkServerError):
        return None


def _ready_at(path: str) -> ForkServer:
    """The server at ``path``, connected and ready; ConfigError (none there) or ForkServerError, closed."""
    server = ForkServer.connect(path)
    try:
        server.ready()
    except ForkServerError:
        server.close()
        raise
    return server


def supported() -> bool:
    """Linux (parent-death signals, pidfds) and a Python that passes descriptors over sockets."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def _tell(line: str) -> None:
    if line not in _told:
        _told.add(line)
        print(f"hpctrain: {line}; starting the workers as fresh processes", file=sys.stderr, flush=True)


# Arguments after which ``hpctrain`` starts no run here: informational flags, a Slurm cluster, a dry run.
_NO_LOCAL_RUN = ("-h", "--help", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--cfg", "-c",
                 "--package", "-p", "--resolve", "--experimental-rerun", "dry_run=true", "dry_run=True",
                 "cluster.fork_server=false", "cluster.fork_server=False")  # fmt: skip


def prestart(argv: Sequence[str]) -> None:
    """Start this process's server now when ``argv`` (the command's) looks like a local run, so that its
    imports overlap composing and checking the run; :func:`keep_prestarted` decides once the run is known."""
    global _prestarted
    if _prestarted is None and os.environ.get(FORKSERVER_ENV) is None and looks_local(argv):
        _prestarted = ForkServer.start()


def looks_local(argv: Sequence[str]) -> bool:
    """Whether ``hpctrain ARGV`` may start a local run (a guess from the words alone: the config decides)."""
    for arg in argv:
        name, _, value = arg.lstrip("+").partition("=")
        if arg in _NO_LOCAL_RUN or (name == "cluster" and value != "local"):
            return False
    return True


def keep_prestarted(local_run: bool) -> None:
    """Keep the server :func:`prestart` started for a local run with ``cluster.fork_server``; else stop it."""
    if not local_run:
        stop_prestarted()


def stop_prestarted() -> None:
    global _prestarted
    if _prestarted is not None:
        _prestarted.close()
        _prestarted = None
