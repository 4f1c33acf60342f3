"""Turn a fork of the server into ``python -m MODULE ARGS`` as a fresh interpreter would have started it.

What a fresh interpreter gets from its launcher, the child is given from the request: its session (it leads
its own, so the launcher can kill its process group), a parent-death signal bound to the server, stdin from
/dev/null, stdout and stderr to the rank's log, the console under the number the environment names, the
launcher's umask, signal mask, ignored signals, resource limits, CPU affinity and niceness, its cwd and,
exactly, its environment. What a fresh interpreter builds at start is rebuilt: ``sys.path`` (cwd, then
PYTHONPATH made absolute, then the site part, duplicates dropped, as ``site`` does), ``sys.argv`` and
``sys.orig_argv``, /proc/PID/cmdline and /proc/PID/environ (in room the server's own reserved), the
standard streams (buffered or not as PYTHONUNBUFFERED says), default signal handlers, a new random state
for Python's ``random``, numpy's global generator and torch's default generator, and the thread counts
torch and OpenBLAS read from the environment when they loaded. Hash randomisation is the one thing a fork
keeps: every child shares the server's string hash seed.

Where the request's environment differs from the server's in something read only when an interpreter or a
library starts (PYTHON*, the locale, OpenMP/MKL settings other than OMP_NUM_THREADS, LD_*, malloc tunables,
TORCH_*), or it does not fit the server's room, the child execs a fresh interpreter instead, after the same
setup: slower, never different.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import io
import logging
import os
import resource
import runpy
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1
# Read once by the interpreter or a library as it starts, so a fork cannot take a new value.
STARTUP_PREFIXES = ("PYTHON", "LC_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_", "LD_", "MALLOC_",
                    "TORCH_", "PYTORCH_")  # fmt: skip
STARTUP_NAMES = ("LANG", "LANGUAGE", "HOME", "TZ", "GLIBC_TUNABLES")
# ... except these, which the child applies itself.
APPLIED = ("PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS")


def startup_difference(
    server_env: Mapping[str, str], env: Mapping[str, str], prefixes: tuple[str, ...] = STARTUP_PREFIXES
) -> str | None:
    """The first variable read at start whose value the request changes (None: a fork can honour it)."""
    names = {n for n in (*server_env, *env) if n.startswith(prefixes) or n in STARTUP_NAMES}
    for name in sorted(names - set(APPLIED)):
        if server_env.get(name) != env.get(name):
            return name
    threads = env.get("OMP_NUM_THREADS")
    if threads != server_env.get("OMP_NUM_THREADS") and not _positive(threads):
        return "OMP_NUM_THREADS"  # applied only as a count: unset, or another form, takes a fresh start
    return None


def startup_prefixes() -> tuple[str, ...]:
    """:data:`STARTUP_PREFIXES` for this process: KMP_* only where Intel's OpenMP is loaded (it reads them
    as it loads; torch's CPU wheels use GNU OpenMP, and a libiomp a child loads reads them then)."""
    with open("/proc/self/maps") as maps:
        if "libiomp" in maps.read():
            return STARTUP_PREFIXES
    return tuple(p for p in STARTUP_PREFIXES if p != "KMP_")


def _positive(value: str | None) -> bool:
    return value is not None and value.strip().isdigit() and int(value) > 0


def areas() -> tuple[int, int]:
    """Bytes of this process's argument and environment areas (/proc/self/stat fields 48-51, proc(5))."""
    (arg_start, arg_end), (env_start, env_end) = _area(45), _area(47)
    return arg_end - arg_start, env_end - env_start


def _area(index: int) -> tuple[int, int]:
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
    return int(fields[index]), int(fields[index + 1])


def cmdline_bytes(args: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(a) + b"\0" for a in args)


def environ_bytes(env: Mapping[str, str]) -> bytes:
    return b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())


def set_cmdline(args: Sequence[str]) -> bool:
    """Write ``args`` into this process's argument area, NUL-separated as exec leaves them, so ps and
    /proc/PID/cmdline show them (the rest of the area stays NULs). False when they do not fit."""
    return _write_area(45, cmdline_bytes(args))


def set_environ_block(env: Mapping[str, str]) -> bool:
    """Write ``env`` into this process's environment area, as exec leaves it, so /proc/PID/environ shows it.
    Only once os.environ has been replaced: C's environ then points at copies, not into the area."""
    return _write_area(47, environ_bytes(env))


def _write_area(index: int, data: bytes) -> bool:
    start, end = _area(index)
    if len(data) > end - start:
        return False
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return True


@dataclass(frozen=True)
class Origin:
    """What a child needs to know of the server it was forked from."""

    pid: int
    site_path: list[str]  # sys.path less its first entry and PYTHONPATH's: the same for every interpreter
    env: dict[str, str]  # the server's environment as it started
    by_imports: dict[str, str]  # what the server's imports added to it


def become(request: Mapping[str, Any], fds: Sequence[int], origin: Origin, exec_why: str | None) -> NoReturn:
    """In the forked child: become the requested process; never returns."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # nothing of the server's runs
        _setup(request, fds, origin.pid)
        module, args = str(request["module"]), [str(a) for a in request["args"]]
        argv = [sys.executable, "-m", module, *args]
        mask = [int(s) for s in request["sigmask"]]
        if exec_why is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.execve(sys.executable, argv, dict(request["env"]))
        _python_start(argv, origin)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except BaseException:
        with contextlib.suppress(BaseException):
            print(
                f"hpctrain fork server: cannot start the worker:\n{traceback.format_exc()}", file=sys.stderr
            )
            sys.stderr.flush()
        os._exit(1)
    _run(module)


def _setup(request: Mapping[str, Any], fds: Sequence[int], server_pid: int) -> None:
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before the request was in place
        os._exit(1)
    _arrange_fds(fds[0], fds[1] if len(fds) > 1 else None, request.get("console"))
    ignored = {int(s) for s in request["ignored"]}
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    for name, (soft, hard) in request["limits"].items():
        with contextlib.suppress(OSError, ValueError):  # only root may raise a hard limit
            resource.setrlimit(getattr(resource, name), (soft, hard))
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, request["affinity"])
    with contextlib.suppress(OSError):  # only root may lower niceness
        os.setpriority(os.PRIO_PROCESS, 0, int(request["nice"]))
    os.umask(int(request["umask"]))
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    set_environ_block(os.environ)


def _arrange_fds(log_fd: int, console_fd: int | None, console_at: int | None) -> None:
    """0 ← /dev/null, 1 and 2 ← the log, ``console_at`` ← the console; every other descriptor closed."""
    devnull = os.open(os.devnull, os.O_RDWR)
    wanted = {0: devnull, 1: log_fd, 2: log_fd}
    if console_fd is not None and console_at is not None:
        wanted[int(console_at)] = console_fd
    floor = max(wanted) + 1
    moved = {src: fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, floor) for src in set(wanted.values())}
    low = 0
    for fd in sorted(moved.values()):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1)
    for target, src in wanted.items():
        os.dup2(moved[src], target)  # inheritable, as a spawned process has them
    for fd in moved.values():
        os.close(fd)


def _python_start(argv: list[str], origin: Origin) -> None:
    """What the interpreter does at start, for this environment and cwd; then what the server's imports did
    to the environment (``os.environ.setdefault``, as libraries do it)."""
    env = os.environ
    cwd = os.getcwd()
    # PYTHONPATH made absolute (an empty entry is the cwd), then the site part; site drops duplicates.
    pythonpath = env.get("PYTHONPATH", "")
    entries = [os.path.abspath(e) for e in pythonpath.split(os.pathsep)] if pythonpath else []
    sys.path[:] = [cwd, *dict.fromkeys([*entries, *origin.site_path])]
    sys.path_importer_cache.clear()
    import importlib

    importlib.invalidate_caches()
    sys.argv[:] = ["-m", *argv[3:]]  # runpy puts the module's file in argv[0], as -m does
    sys.orig_argv = list(argv)
    set_cmdline(argv)
    _reopen_stdio(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's own choices at start
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _threads(env, origin.env)
    _reseed()
    for name, value in origin.by_imports.items():
        env.setdefault(name, value)


def _reopen_stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr over fds 0-2, made as CPython's create_stdio makes them (pylifecycle.c);
    logging handlers that held the old streams get the new ones."""
    old = {id(s): n for n, s in (("stdout", sys.stdout), ("stderr", sys.stderr)) if s is not None}
    encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    errors = getattr(sys.__stdout__, "errors", None) or "strict"
    made = {
        "stdin": _stream(0, "r", "<stdin>", encoding, errors, unbuffered),
        "stdout": _stream(1, "w", "<stdout>", encoding, errors, unbuffered),
        "stderr": _stream(2, "w", "<stderr>", encoding, "backslashreplace", unbuffered),
    }
    for name, stream in made.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in old:
                handler.setStream(made[old[id(stream)]])


def _stream(fd: int, mode: str, name: str, encoding: str, errors: str, unbuffered: bool) -> io.TextIOWrapper:
    write = mode == "w"
    buffering = 0 if unbuffered and write else -1
    buf: Any = open(fd, mode + "b", buffering=buffering, closefd=False)  # noqa: SIM115
    raw = buf if buffering == 0 else buf.raw
    raw.name = name
    stream = io.TextIOWrapper(
        buf,
        encoding=encoding,
        errors=errors,
        newline="\n",
        line_buffering=not unbuffered and (raw.isatty() or fd == 2),
        write_through=unbuffered,
    )
    stream.mode = mode  # type: ignore[misc]
    return stream


def _threads(env: Mapping[str, str], server_env: Mapping[str, str]) -> None:
    """The OpenMP and OpenBLAS thread counts a fresh interpreter would have set from this environment; the
    server's were set from its own (OpenBLAS's to one thread there: no thread pool before a fork)."""
    limits = {}
    threads = env.get("OMP_NUM_THREADS")
    if threads != server_env.get("OMP_NUM_THREADS") and _positive(threads):
        # torch's import sets OpenMP's count from OMP_NUM_THREADS (at::init_num_threads), MKL_* aside (those
        # make the child exec): the same call, without torch.set_num_threads' changes to MKL.
        limits["openmp"] = int(str(threads))
    if "numpy" in sys.modules:
        # OpenBLAS's choice as it loads (driver/others/blas_server.c, blas_get_cpu_number):
        # OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else OMP_NUM_THREADS, else every CPU; at most the
        # CPUs this process may run on.
        names = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
        chosen = next((int(v) for v in map(env.get, names) if v is not None and _positive(v)), None)
        cpus = len(os.sched_getaffinity(0))
        if min(chosen or cpus, cpus) != 1:
            limits["openblas"] = min(chosen or cpus, cpus)
    if limits:
        # threadpoolctl finds the loaded runtimes; its import sets KMP_DUPLICATE_LIB_OK, which a fresh
        # interpreter has only once something imports it: undone, and imported afresh by whoever wants it.
        before = dict(os.environ)
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=limits)
        os.environ.clear()
        os.environ.update(before)
        for name in [m for m in sys.modules if m == "threadpoolctl" or m.startswith("threadpoolctl.")]:
            del sys.modules[name]


def _reseed() -> None:
    import random

    random.seed()  # from os.urandom, as at import
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # the legacy global RandomState seeds itself from the OS when created
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # as torch's import seeds it: non-deterministically


def _run(module: str) -> NoReturn:
    """Run the module as ``-m`` does and end as the interpreter would."""
    code: Any = 0
    sys.modules.pop(module, None)  # the server imported it; ``-m`` runs it as __main__ only
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except KeyboardInterrupt:
        traceback.print_exc()
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as Python ends on an uncaught Ctrl-C
        code = 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush()
    os._exit(code & 0xFF)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
