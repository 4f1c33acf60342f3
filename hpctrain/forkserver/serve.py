"""The fork server's process: import torch and the worker side once, then fork one child per request.

    python -m hpctrain.forkserver --socket PATH      # a server for launches that set HPCTRAIN_FORKSERVER=PATH
    python -m hpctrain.forkserver --socket PATH --import transformers.modeling_utils  # and a heavy library
    (--fd N --parent PID)                            # one launch's own server, on a socketpair it inherited
    (--fd N --parent PID --share PATH)               # ... that the other Slurm tasks of its node join at PATH

Imports only (no CUDA initialisation, no torch operation, OpenBLAS held to one thread): the process stays
single-threaded, so a fork copies nothing half-done; a server that finds itself with threads anyway execs a
fresh interpreter for each child instead. One thread serves every connection with a selector: requests
(hello, spawn; the descriptors of a rank's log and console beside them) and each child's pidfd, whose exit
status goes back to the connection that asked for it. A connection that closes (its launcher ended or was
killed) has its children's process groups SIGKILLed. A launch's own server dies with its launcher (its
parent-death signal), and its children with it (theirs is bound to the server). SIGTERM or SIGINT: the
children are killed, the socket removed.

A Slurm task's restart agent (:mod:`hpctrain.launch.agent`) starts its server with
``HPCTRAIN_FORKSERVER_SHIELD=1``: Slurm signals every process of a step (the warning signal, SIGTERM on
pre-emption), and the server must neither die of USR2 nor kill the worker that is saving its checkpoint on
SIGTERM. Such a server ignores them (the agent forwards them to the worker) and dies with SIGKILL when the
agent dies. With ``--share PATH`` (:mod:`hpctrain.launch.nodeserver`) it also listens at PATH for the other
tasks of its node and job step, and ends once its own connection, every joined one and every child are gone.

Over 400 lines: the server's one selector loop, its children's lifetimes and its start-up (preload, socket,
parent death, signals, refusals of a bad ``--import``) share the process's state; the child's side lives in
:mod:`hpctrain.forkserver.child`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import os
import re
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hpctrain.forkserver import child
from hpctrain.launch.forkwire import ROOM_ENV, MessageReader, identity, room_args, room_env, send_message

PR_SET_PDEATHSIG = 1


class _Stop(Exception):
    """SIGTERM, SIGINT or SIGHUP reached the server."""


def preload(extra: Sequence[str] = ()) -> None:
    """What every worker imports on its way to the first step, imported once here (nothing is run); and the
    ``extra`` modules a persistent server was asked for (``--import``)."""
    import hydra.utils  # noqa: F401
    import numpy.random  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401

    import hpctrain.models.builtin
    import hpctrain.models.layers
    import hpctrain.observe.loggers
    import hpctrain.rendezvous.group
    import hpctrain.resilience.stop
    import hpctrain.resilience.watchdog
    import hpctrain.task.script
    import hpctrain.task.train
    import hpctrain.train.overrides
    import hpctrain.train.trainer
    import hpctrain.worker  # noqa: F401
    from hpctrain import torchapi

    # What torch imports lazily on a worker's way to its first step (the optimizer's first step imports
    # dynamo, ~2 s here).
    torchapi.preload_lazy_modules()
    for name in extra:
        importlib.import_module(name)


# A dotted module name: what --import accepts (anything else is refused before an import is tried).
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass
class _Client:
    sock: socket.socket
    reader: MessageReader
    children: set[int] = field(default_factory=set)


@dataclass
class _Child:
    pid: int
    pidfd: int
    client: _Client | None
    request_id: int


class Server:
    def __init__(
        self, listener: socket.socket | None, origin: child.Origin, ident: dict[str, str], owned: bool = False
    ) -> None:
        self.listener = listener
        self.owned = owned  # a launch's own (its socketpair): it ends with its connections even if it listens
        self.origin = origin
        self.identity = ident
        self.prefixes = child.startup_prefixes()
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, _Child] = {}
        self.clients: list[_Client] = []
        self.rooms = child.areas()
        threads = len(os.listdir("/proc/self/task"))
        # Interpreter options (-X dev, -O, ...) a fresh ``python -m hpctrain.worker`` would not have.
        options = sys.orig_argv[1 : sys.orig_argv.index("-m")] if "-m" in sys.orig_argv else []
        self.no_fork = (
            f"the server has {threads} threads"
            if threads > 1
            else f"the server runs with interpreter options {' '.join(options)}"
            if options
            else None
        )
        if listener is not None:
            self.selector.register(listener, selectors.EVENT_READ, self._accept)

    def add_client(self, sock: socket.socket) -> None:
        client = _Client(sock, MessageReader(sock))
        self.clients.append(client)
        self.selector.register(sock, selectors.EVENT_READ, lambda: self._on_client(client))

    def run(self) -> None:
        """Serve until stopped; a launch's own server ends when its clients and children are gone."""
        while (self.listener is not None and not self.owned) or self.clients or self.children:
            for key, _ in self.selector.select():
                key.data()

    def _accept(self) -> None:
        assert self.listener is not None
        sock, _ = self.listener.accept()
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.geteuid():  # a server forks as its own user: no one else may ask
            sock.close()
            return
        self.add_client(sock)

    def _on_client(self, client: _Client) -> None:
        try:
            alive = client.reader.feed()
            for message, fds in client.reader.messages():
                self._handle(client, message, fds)
        except (OSError, ValueError):
            alive = False
        if not alive:
            self._drop(client)

    def _handle(self, client: _Client, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        try:
            if op == "hello":
                self._send(client, {"op": "hello", "pid": os.getpid(), "identity": self.identity})
            elif op == "spawn" and len(fds) in (1, 2):
                self._spawn(client, message, fds)
            else:
                raise ValueError(f"a request the server does not know: {op!r} with {len(fds)} descriptors")
        except Exception as err:  # a bad request costs its sender an error, never the server
            self._send(client, {"op": "error", "id": message.get("id"), "message": str(err)})
        finally:
            for fd in fds:
                os.close(fd)

    def _spawn(self, client: _Client, request: dict[str, Any], fds: list[int]) -> None:
        differs = child.startup_difference(self.origin.env, request["env"], self.prefixes)
        why = self.no_fork or (
            differs and f"{differs} differs from the server's, read as an interpreter starts"
        )
        argv = [sys.executable, "-m", str(request["module"]), *map(str, request["args"])]
        sizes = len(child.cmdline_bytes(argv)), len(child.environ_bytes(request["env"]))
        if why is None and any(size > room for size, room in zip(sizes, self.rooms, strict=True)):
            why = "its command line or environment is larger than the server's room for it"
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as err:
            send_message(client.sock, {"op": "error", "id": request["id"], "message": f"fork: {err}"})
            return
        if pid == 0:
            try:
                child.become(request, fds, self.origin, why)
            finally:
                os._exit(1)
        pidfd = os.pidfd_open(pid)
        record = _Child(pid, pidfd, client, int(request["id"]))
        self.children[pid] = record
        client.children.add(pid)
        self.selector.register(pidfd, selectors.EVENT_READ, lambda: self._reap(record))
        mode = "fork" if why is None else f"exec: {why}"
        self._send(client, {"op": "started", "id": record.request_id, "pid": pid, "mode": mode})

    def _reap(self, record: _Child) -> None:
        _, status = os.waitpid(record.pid, 0)
        self.selector.unregister(record.pidfd)
        os.close(record.pidfd)
        del self.children[record.pid]
        client = record.client
        if client is not None:
            client.children.discard(record.pid)
            code = os.waitstatus_to_exitcode(status)
            self._send(client, {"op": "exit", "id": record.request_id, "returncode": code})

    def _send(self, client: _Client, message: dict[str, Any]) -> None:
        try:
            send_message(client.sock, message)
        except OSError:
            self._drop(client)

    def _drop(self, client: _Client) -> None:
        """The client hung up (or died): its children go, with everything in their process groups."""
        if client not in self.clients:
            return
        self.clients.remove(client)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client.sock)
        client.sock.close()
        client.reader.close()
        for pid in client.children:
            _kill(pid)
            self.children[pid].client = None

    def shutdown(self) -> None:
        for pid in list(self.children):
            _kill(pid)
        for record in list(self.children.values()):
            self._reap(record)
        for client in list(self.clients):
            self._drop(client)


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):  # os.kill: a child that has not reached its setsid yet
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def site_path(env: dict[str, str]) -> list[str]:
    """This interpreter's sys.path less its first entry and what PYTHONPATH put there: the part every
    interpreter of this Python builds alike (stdlib, site-packages, .pth entries)."""
    pythonpath = env.get("PYTHONPATH", "")
    own = {os.path.abspath(e) for e in pythonpath.split(os.pathsep)} if pythonpath else set()
    return [p for p in sys.path[1:] if p not in own]


def _listen(path: str) -> socket.socket:
    """A socket at ``path`` only this user can reach; a stale one (no server answers) is replaced."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise SystemExit(f"hpctrain fork server: {path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # stale: its server is gone
        else:
            raise SystemExit(f"hpctrain fork server: another server already listens at {path}")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        listener.bind(path)
    except OSError as err:
        raise SystemExit(f"hpctrain fork server: cannot listen at {path}: {err.strerror}") from None
    finally:
        os.umask(umask)
    listener.listen(64)
    return listener


SHIELD_ENV = "HPCTRAIN_FORKSERVER_SHIELD"
SHIELDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGURG)


def _die_with(parent: int, shielded: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL if shielded else signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(0)


def _on_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _bad_imports(names: Sequence[str], socket_path: str | None) -> str | None:
    """What is wrong with ``--import``'s modules (one line), or None."""
    if names and socket_path is None:
        return "--import goes with --socket (a server kept running for many launches)"
    for name in names:
        if MODULE_NAME.fullmatch(name) and importlib.util.find_spec(name.split(".")[0]) is None:
            return (
                f"--import {name}: no module named {name.split('.')[0]!r} in this Python ({sys.executable})"
            )
        if not MODULE_NAME.fullmatch(name):
            return f"--import {name!r}: not a module name (valid: a dotted name, e.g. numpy.linalg)"
    return None


def main(argv: list[str]) -> NoReturn:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="listen at this path (HPCTRAIN_FORKSERVER=PATH uses it)")
    where.add_argument(
        "--fd", type=int, help=argparse.SUPPRESS
    )  # a launch's own: an inherited socketpair end
    parser.add_argument("--share", help=argparse.SUPPRESS)  # with --fd: the node's other tasks join here
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # die with this pid
    parser.add_argument("--room", help=argparse.SUPPRESS)  # room in the command line for the children's
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --socket: import MODULE too before serving, once for every rank it forks (a library the "
        "model needs that takes seconds to import: transformers.modeling_utils)",
    )
    args = parser.parse_args(argv)
    if args.share is not None and args.fd is None:
        parser.error("--share goes with --fd")
    bad = _bad_imports(args.imports, args.socket)
    if bad:
        print(f"{parser.prog}: {bad}", file=sys.stderr)
        raise SystemExit(2)
    if args.room is None:  # started by hand: again, with the room
        os.execve(sys.executable, [*sys.orig_argv, *room_args()], {**os.environ, **room_env()})
    os.environ.pop(ROOM_ENV, None)  # the block keeps it, for the children's environments
    shielded = os.environ.pop(SHIELD_ENV, "") == "1"
    listen_at = args.socket or args.share

    def stop_starting(_signum: int, _frame: object) -> None:
        # Stopped while it starts (a launch refused its config and ends this server before it is up): quietly,
        # with no traceback on the launch's console and no socket left behind.
        if listen_at:
            with contextlib.suppress(OSError):
                os.unlink(listen_at)
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop_starting)
    if shielded:
        for sig in SHIELDED:
            signal.signal(sig, signal.SIG_IGN)
    if args.parent is not None:
        _die_with(args.parent, shielded)
    try:
        os.close(os.pidfd_open(os.getpid()))  # how a child's exit is awaited
    except (AttributeError, OSError) as err:
        raise SystemExit(f"hpctrain fork server: needs Linux 5.3 or later (pidfd_open): {err}") from None
    at = sys.orig_argv.index("--room")
    child.set_cmdline([*sys.orig_argv[:at], *sys.orig_argv[at + 2 :]])  # ps shows the command, not the room
    started = time.monotonic()
    startup_env = dict(os.environ)
    paths = site_path(startup_env)
    ident = identity()  # before the imports: a source changed while they ran is a change
    code = 0
    listener = _listen(listen_at) if listen_at else None
    try:
        for sig in () if shielded else (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _on_stop)  # from here the finally below closes and removes the socket
        os.environ["OPENBLAS_NUM_THREADS"] = "1"  # numpy's OpenBLAS starts no thread pool here
        # Nothing collected while the imports run (~0.4 of the preload's ~4.5 CPU-s here: the collector
        # traversed the growing heap again and again); then one collection, and what is left frozen, so that
        # no child's collection traverses the preloaded heap (and no child's page of it is copied for that).
        gc.disable()
        try:
            preload(args.imports)
        except ImportError as err:  # --import named what is not installed: one line, no socket left
            print(f"{parser.prog}: --import: {err}", file=sys.stderr, flush=True)
            code = 2
            raise _Stop from None
        # What the imports put in the environment, a worker's own imports would have put in its own.
        by_imports = {
            k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS" and startup_env.get(k) != v
        }
        os.environ.clear()
        os.environ.update(startup_env)
        gc.collect()
        gc.freeze()
        gc.enable()  # in every child too: it collects what it makes itself
        origin = child.Origin(os.getpid(), paths, startup_env, by_imports)
        server = Server(listener, origin, ident, owned=args.fd is not None)
        if args.fd is not None:
            server.add_client(socket.socket(fileno=args.fd))
        if args.socket:
            took = time.monotonic() - started
            print(
                f"hpctrain fork server: pid {os.getpid()} at {args.socket}, ready in {took:.1f} s "
                f"(hpctrain {ident['version']} from {ident['package']}; restart it after changing it)",
                flush=True,
            )
            if server.no_fork:
                print(
                    f"hpctrain fork server: {server.no_fork}: every child execs a fresh interpreter",
                    flush=True,
                )
        try:
            server.run()
        finally:
            server.shutdown()
    except _Stop:
        pass
    finally:
        if listener is not None and listen_at:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listen_at)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(
        code
    )  # tearing down an interpreter that holds torch takes seconds, and there is nothing to tear down
