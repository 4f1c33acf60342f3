"""Workers forked from a fork server (hpctrain.forkserver, hpctrain.launch.forked), end to end: a forked child
is what ``python -m MODULE`` would have been, runs are bitwise those of fresh interpreters, nothing outlives
a killed launcher or a dead server, and a bad HPCTRAIN_FORKSERVER is one line.

The session's own server (tests/conftest.py) serves the rest of the suite; here a server is also started
for the tests that need one of their own (to kill it, or from another checkout).

Over 400 lines: the fork server's end-to-end journeys share the servers they start (their own, another
checkout's, a dead one) and the probe module that compares a forked child with a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hpctrain.errors import ConfigError
from hpctrain.launch.forked import FORKSERVER_ENV, OFF, SERVER_MODULE, ForkServer
from tests.support import FAST, REPO, fork_server_imports, hpctrain, metrics, model_and_optimizer, worker_pids

# What a process can tell of how it was started (random draws and the hash seed aside), after importing what
# a worker imports (the fork server's preload: imports can set environment variables).
PROBE = r"""
import gc, json, os, random, resource, signal, sys
from hpctrain.forkserver.serve import preload
preload([name for name in os.environ["FSPROBE_IMPORTS"].split(",") if name])  # what the server has too
env = dict(os.environ)  # before threadpoolctl, which sets a variable as it is imported
import numpy, threadpoolctl, torch

def disposition(sig):
    handler = signal.getsignal(sig)
    named = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}
    return named.get(handler, getattr(handler, "__name__", "?"))

def fds():
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return {fd: target for fd, target in found.items() if not target.startswith("/proc/")}

def stream(s):
    raw = getattr(s.buffer, "raw", s.buffer)
    kind = type(s.buffer).__name__
    return [s.encoding, s.errors, s.line_buffering, s.write_through, kind, raw.name, s.mode]

main = sys.modules["__main__"]
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().rstrip(b"\0").decode().split("\0")
with open("/proc/self/environ", "rb") as f:  # the block exec left, whatever os.environ became since
    block = f.read().rstrip(b"\0").decode().split("\0")
report = {
    "path": sys.path, "argv": sys.argv, "orig_argv": sys.orig_argv, "cmdline": cmdline, "block": block,
    "env": env, "cwd": os.getcwd(), "umask": os.umask(0o022),
    "signals": {int(s): disposition(s) for s in signal.valid_signals()},
    "mask": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
    "fds": fds(), "stdio": [stream(sys.stdin), stream(sys.stdout), stream(sys.stderr)],
    "session": [os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid()],
    "main": [__name__, main.__spec__.name, main.__file__, "fsprobe" in sys.modules],
    "threads": [torch.get_num_threads(), sorted((i["internal_api"], i["num_threads"])
                for i in threadpoolctl.threadpool_info())],
    "tasks": len(os.listdir("/proc/self/task")),
    "limits": resource.getrlimit(resource.RLIMIT_NOFILE), "affinity": sorted(os.sched_getaffinity(0)),
    "draws": [random.random(), float(numpy.random.random()), float(torch.rand(1))],
    "hash": hash("hpctrain"),
    "gc": [gc.isenabled(), gc.get_threshold()],  # the server collects nothing while it imports; a child does
}
print(json.dumps(report), flush=True)
"""


def _start_server(
    cwd: Path, *, parent: bool = True, options: tuple[str, ...] = (), server_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    """A fork server of this test's own (its socket in a short directory: AF_UNIX paths are short)."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="fs"), "s.sock")
    command = [sys.executable, *options, "-m", SERVER_MODULE, "--socket", path, *server_args]
    if parent:
        command += ["--parent", str(os.getpid())]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, env=env)
    while True:
        assert server.poll() is None, f"the fork server ended with {server.returncode}"
        try:
            client = ForkServer.connect(path)
            break
        except ConfigError:
            time.sleep(0.05)
    client.hello(timeout=300)
    client.close()
    return server, path


@pytest.fixture(scope="module")
def server_path(fork_server: str | None) -> Iterator[str]:
    """The session's server when there is one, else one for this module."""
    if fork_server and fork_server != OFF:
        yield fork_server
        return
    server, path = _start_server(REPO)
    yield path
    server.terminate()
    server.wait(timeout=30)


def _cli(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``python -m hpctrain ARGS`` in exactly ``env`` (conftest's helper adds to the session's)."""
    command = [sys.executable, "-m", "hpctrain", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _probe(tmp_path: Path, env: dict[str, str], console: int, server: ForkServer | None) -> dict:
    """Run the probe as ``python -m fsprobe`` from tmp_path: a fresh interpreter started as the local
    launcher starts one (server None), or forked by ``server``."""
    log = tmp_path / f"probe{time.monotonic_ns()}.log"
    with open(log, "ab") as out:
        if server is None:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fsprobe"],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(console,),
            )
        else:
            proc = server.spawn("fsprobe", [], env, out.fileno(), console, cwd=str(tmp_path))  # type: ignore[assignment]
    assert proc.wait(timeout=120) == 0, log.read_text()
    report = json.loads(log.read_text().strip().splitlines()[-1])
    report["fds"] = {fd: "LOG" if target == str(log) else target for fd, target in report["fds"].items()}
    return report


def test_a_forked_child_is_what_a_fresh_interpreter_would_be(
    tmp_path: Path, server_path: str, fork_server: str | None
):
    (tmp_path / "fsprobe.py").write_text(PROBE)
    (tmp_path / "lib").mkdir()
    console_file = open(tmp_path / "console", "wb")  # noqa: SIM115
    console = console_file.fileno()
    env = {
        **os.environ,
        "PYTHONPATH": f"lib::{tmp_path}/lib/../lib:{REPO}",  # relative, empty and repeated entries
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "HPCTRAIN_CONSOLE_FD": str(console),
        "ONLY_IN_THE_FIRST": "1",
        # The session's server imports these too (tests.support.fork_server_imports); a server of this
        # module's own imports nothing more.
        "FSPROBE_IMPORTS": ",".join(fork_server_imports() if server_path == fork_server else []),
    }
    server = ForkServer.connect(server_path)
    try:
        fresh = _probe(tmp_path, env, console, None)
        forked = _probe(tmp_path, env, console, server)
        without = {k: v for k, v in env.items() if k != "ONLY_IN_THE_FIRST"}
        again = _probe(tmp_path, without, console, server)
        # Another hash seed than the server's: read as the interpreter starts, so the child execs one.
        seeded = {**env, "PYTHONHASHSEED": "7"}
        exec_fresh, exec_forked = (
            _probe(tmp_path, seeded, console, None),
            _probe(tmp_path, seeded, console, server),
        )
    finally:
        server.close()
        console_file.close()
    for key in fresh.keys() - {"draws", "hash"}:
        assert forked[key] == fresh[key], (key, forked[key], fresh[key])
    expected = {k: v for k, v in fresh["env"].items() if k != "ONLY_IN_THE_FIRST"}
    assert again["env"] == expected, "the previous request's environment leaked into the next child"
    # Re-seeded: Python's random, numpy's global generator and torch's default one differ from child to child.
    assert all(a != b for a, b in zip(forked["draws"], again["draws"], strict=True))
    for key in exec_fresh.keys() - {"draws"}:
        assert exec_forked[key] == exec_fresh[key], (key, exec_forked[key], exec_fresh[key])


EXACT = [*FAST, "trainer.max_steps=4", "trainer.log_every=1", "trainer.eval_every=0", "cluster.nproc=2"]


def _final(run: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    return [m["loss"] for m in metrics(run)], model_and_optimizer(run / "checkpoints" / "step_00000004")


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_forked_runs_are_bitwise_the_spawned_ones(tmp_path: Path, parallel: str, server_path: str):
    spawned, forked = tmp_path / "spawned", tmp_path / "forked"
    args = [*EXACT, f"parallel={parallel}"]
    a = hpctrain(*args, "cluster.fork_server=false", f"hydra.run.dir={spawned}")
    b = hpctrain(*args, f"hydra.run.dir={forked}", env={FORKSERVER_ENV: server_path})
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "forked from fork server" in (forked / "hpctrain.log").read_text()
    assert "forked from" not in (spawned / "hpctrain.log").read_text()
    runs = [_final(spawned), _final(forked)]
    if parallel == "ddp":  # and from a server of the launch's own
        own = tmp_path / "own"
        c = _cli(*args, f"hydra.run.dir={own}", env=_env("per-launch", server_path))
        assert c.returncode == 0, c.stderr
        assert "forked from fork server" in (own / "hpctrain.log").read_text()
        runs.append(_final(own))
    (losses, weights), *others = runs
    assert len(losses) == 4
    for other_losses, other_weights in others:
        assert other_losses == losses
        assert other_weights.keys() == weights.keys()
        assert all(torch.equal(weights[k], other_weights[k]) for k in weights)


def _launch(run: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    args = [*FAST, "trainer.max_steps=100000", "trainer.log_every=1", "trainer.ckpt_every=0", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={run}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_training(run: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


def _servers_of(launcher: int) -> list[int]:
    """Fork servers whose parent is ``launcher`` (a launch's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and SERVER_MODULE.encode() in (entry / "cmdline").read_bytes():
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == launcher:
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _gone(pids: list[int], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _env(kind: str, server_path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
    if kind == "persistent":
        env[FORKSERVER_ENV] = server_path
    elif kind == "spawned":
        env[FORKSERVER_ENV] = OFF
    return env


@pytest.mark.parametrize("kind", ["persistent", "per-launch", "spawned"])
def test_a_killed_launcher_leaves_no_workers(tmp_path: Path, kind: str, server_path: str):
    run = tmp_path / "run"
    proc = _launch(run, _env(kind, server_path))
    try:
        _wait_for_training(run, proc)
        workers = worker_pids(run)
        assert len(workers) == 2
        own = _servers_of(proc.pid)
        assert len(own) == (kind == "per-launch"), own
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _gone(workers), f"orphans: {worker_pids(run)}"
    assert _gone(own), f"the launch's fork server outlived it: {own}"


@pytest.mark.parametrize("kind", ["persistent", "per-launch"])
def test_a_server_that_dies_mid_run_fails_the_launch_in_one_line(tmp_path: Path, kind: str):
    run = tmp_path / "run"
    env = _env(kind, "")
    server = None
    if kind == "persistent":
        server, env[FORKSERVER_ENV] = _start_server(REPO, parent=False)
    proc = _launch(run, env)
    try:
        _wait_for_training(run, proc)
        workers = worker_pids(run)
        victim = server.pid if server else _servers_of(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if server is not None:
            server.kill()
            server.wait()
    assert proc.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("hpctrain:")]
    assert len(lines) == 1, stderr
    assert f"the fork server (pid {victim})" in lines[0] and "died" in lines[0], lines[0]
    assert _gone(workers), f"orphans: {worker_pids(run)}"


def _stale_socket(tmp_path: Path) -> str:
    import socket

    path = str(tmp_path / "stale.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)  # bound, never listening, closed: the file of a server that is gone
    sock.close()
    return path


def _regular_file(tmp_path: Path) -> str:
    (tmp_path / "notes.txt").write_text("not a socket")
    return str(tmp_path / "notes.txt")


BAD = [
    (lambda tmp: str(tmp / "missing.sock"), "no such file"),
    (_regular_file, "not a socket"),
    (_stale_socket, "no fork server answers there"),
    (lambda tmp: "", "not a socket path"),
    (lambda tmp: f"{tmp}/s\n.sock", "not a socket path"),
]


@pytest.mark.parametrize(
    ("value", "words"), BAD, ids=["missing", "regular file", "stale", "empty", "newline"]
)
def test_a_bad_server_path_is_one_line_and_nothing_is_written(tmp_path: Path, value, words: str):  # type: ignore[no-untyped-def]
    path = value(tmp_path)
    run = tmp_path / "out" / "run"
    result = hpctrain(*FAST, "trainer.max_steps=2", f"hydra.run.dir={run}", env={FORKSERVER_ENV: path})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpctrain: {FORKSERVER_ENV}="), result.stderr
    assert words in lines[0] and "python -m hpctrain.forkserver --socket PATH" in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "out").exists(), "something was written"


def test_fork_server_key_takes_a_boolean(tmp_path: Path):
    for value in ("maybe", "", "'\x1b[2J'"):
        overrides = ["dry_run=true", f"cluster.fork_server={value}"]
        result = hpctrain(*overrides, cwd=tmp_path, timeout=60, env={"PYTHONPATH": str(REPO)})
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpctrain: cluster.fork_server="), result.stderr
        assert "expected true or false" in lines[0], lines[0]
        assert list(tmp_path.iterdir()) == []


def test_a_server_of_another_checkout_is_refused_and_the_workers_start_fresh(tmp_path: Path):
    other = tmp_path / "other"
    shutil.copytree(REPO / "hpctrain", other / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "hpctrain" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "9.9.9+'))
    server, path = _start_server(other)
    try:
        run = tmp_path / "run"
        result = hpctrain(*EXACT, "trainer.max_steps=2", f"hydra.run.dir={run}", env={FORKSERVER_ENV: path})
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"not forking from the fork server at {path}: it runs hpctrain from {other}" in lines[0], lines[0]
    assert "starting the workers as fresh processes" in lines[0]
    assert "forked from" not in (run / "hpctrain.log").read_text()


def test_a_users_project_imports_in_a_forked_child(tmp_path: Path, server_path: str):
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "user_project", project)
    run = tmp_path / "run"
    result = hpctrain(
        "--config-dir",
        "conf",
        "model=cnn",
        "data=digits8",
        "trainer.max_steps=2",
        "trainer.log_every=1",
        "logger=jsonl",
        f"hydra.run.dir={run}",
        cwd=project,
        env={FORKSERVER_ENV: server_path, "PYTHONPATH": str(REPO)},  # this checkout's hpctrain, as served
    )
    assert result.returncode == 0, result.stderr
    assert "forked from fork server" in (run / "hpctrain.log").read_text()
    assert "fresh interpreter" not in (run / "hpctrain.log").read_text()
    assert [m["step"] for m in metrics(run)] == [1, 2]


def test_a_server_run_with_interpreter_options_starts_fresh_interpreters(tmp_path: Path):
    """``python -X dev -m hpctrain.forkserver``: its children would inherit -X dev, which a spawned worker
    does not have; each execs a fresh interpreter instead."""
    (tmp_path / "flags.py").write_text("import sys\nprint(sys.flags.dev_mode, flush=True)\n")
    server, path = _start_server(REPO, options=("-X", "dev"))
    client = ForkServer.connect(path)
    try:
        with open(tmp_path / "log", "wb") as out:
            child = client.spawn("flags", [], dict(os.environ), out.fileno(), cwd=str(tmp_path))
        assert child.wait(timeout=60) == 0
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)
    assert child.mode == "exec: the server runs with interpreter options -X dev"
    assert (tmp_path / "log").read_text() == "False\n"


def test_a_server_stopped_while_it_starts_exits_quietly(tmp_path: Path):
    """A launch that refuses its config ends the server it started beside Hydra's composition, often before
    that server is up: a SIGTERM in each phase of its start (fingerprinting the sources, before the socket
    exists; importing torch, after) leaves no traceback on the console and no socket."""
    for phase in ("identity", "preload"):
        sock = tmp_path / f"{phase}.sock"
        code = (
            "import os, signal, sys\n"
            "import hpctrain.forkserver.serve as serve\n"
            f"original = serve.{phase}\n"
            "def stopped(*args):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return original(*args)\n"
            f"serve.{phase} = stopped\n"
            f"sys.orig_argv = [sys.executable, '-m', 'hpctrain.forkserver', '--room', 'x']\n"
            f"serve.main(['--socket', {str(sock)!r}, '--room', 'x'])\n"
        )
        server = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert server.returncode == 0 and "Traceback" not in server.stderr, (phase, server.stderr)
        assert not sock.exists(), phase


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--import", "nosuchmodule"], "no module named 'nosuchmodule' in this Python"),
        (["--import", ""], "'': not a module name"),
        (["--import", "a\x01b"], "'a\\x01b': not a module name"),
        (["--import", "../outside"], "'../outside': not a module name"),
        (["--import", "json.no_such_part"], "No module named 'json.no_such_part'"),  # found only by importing
    ],
    ids=["not installed", "empty", "control character", "a path", "a missing submodule"],
)
def test_a_bad_import_is_one_line_and_leaves_no_socket(tmp_path: Path, args: list[str], words: str):
    path = tmp_path / "s.sock"
    result = subprocess.run(
        [sys.executable, "-m", SERVER_MODULE, "--socket", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("python -m hpctrain.forkserver")]
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not path.exists()


def test_import_goes_with_a_server_kept_running():
    result = subprocess.run(
        [sys.executable, "-m", SERVER_MODULE, "--fd", "3", "--import", "json"], capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "python -m hpctrain.forkserver: --import goes with --socket (a server kept running for many launches)"
    ]


def test_a_module_the_server_imported_is_in_every_child_it_forks(tmp_path: Path):
    """``--import colorsys`` (a module nothing else imports): the forked child finds it imported."""
    (tmp_path / "has_it.py").write_text("import sys\nprint('colorsys' in sys.modules, flush=True)\n")
    server, path = _start_server(REPO, server_args=("--import", "colorsys"))
    client = ForkServer.connect(path)
    try:
        log = tmp_path / "child.log"
        with open(log, "wb") as out:
            child = client.spawn("has_it", [], {**os.environ, "PYTHONPATH": str(tmp_path)}, out.fileno())
        assert child.wait(timeout=60) == 0, log.read_text()
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)
    assert log.read_text().split() == ["True"]
