"""The fork server's wire and the launcher's side of it, in process: messages and descriptors over a real
socket pair, the client against a scripted server end, which variables make a child exec, the choice of
server, and a bad HPCTRAIN_FORKSERVER in one line. (Forking, killing and parity: tests/e2e/launch.)"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import threading
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.forkserver.child import (
    areas,
    set_cmdline,
    set_environ_block,
    startup_difference,
    startup_prefixes,
)
from hpctrain.launch import forked
from hpctrain.launch.forked import FORKSERVER_ENV, ForkServer, check_socket_path, looks_local, server_for
from hpctrain.launch.forkwire import (
    ForkServerError,
    MessageReader,
    ServerGone,
    ServerMismatch,
    identity,
    launcher_state,
    mismatch,
    send_message,
)


def _read_all(reader: MessageReader) -> list[tuple[dict, list[int]]]:
    """Every message waiting (a receive stops at a message that carries descriptors)."""
    got = []
    while select.select([reader.sock], [], [], 0.2)[0] and reader.feed():
        got += list(reader.messages())
    return got


def _answer(theirs: socket.socket, *replies: dict) -> threading.Thread:
    """The server's end in a thread: wait for a request, then send ``replies``."""

    def serve() -> None:
        select.select([theirs], [], [], 10)
        for reply in replies:
            send_message(theirs, reply)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_messages_and_descriptors_cross_a_socket(tmp_path: Path):
    a, b = socket.socketpair()
    target = tmp_path / "log"
    with open(target, "wb") as out:
        send_message(a, {"op": "spawn", "id": 1}, [out.fileno()])
    send_message(a, {"op": "hello"})
    got = _read_all(MessageReader(b))
    assert [m["op"] for m, _ in got] == ["spawn", "hello"]
    (_, fds), (_, none) = got
    assert len(fds) == 1 and none == []
    os.write(fds[0], b"written through the received descriptor")
    os.close(fds[0])
    assert target.read_bytes() == b"written through the received descriptor"


def test_a_message_split_across_reads_is_reassembled():
    a, b = socket.socketpair()
    reader = MessageReader(b)
    data = b'{"op": "hello", "nfds": 0}'
    a.sendall(struct.pack("!I", len(data)) + data[:5])
    assert _read_all(reader) == []
    a.sendall(data[5:])
    assert _read_all(reader) == [({"op": "hello", "nfds": 0}, [])]


def test_an_oversized_message_is_refused():
    a, b = socket.socketpair()
    a.sendall(struct.pack("!I", 1 << 30))
    with pytest.raises(ForkServerError, match="bytes"):
        _read_all(MessageReader(b))


@pytest.mark.parametrize(
    ("server", "request_env", "differs"),
    [
        ({}, {}, None),
        ({}, {"PYTHONHASHSEED": "1"}, "PYTHONHASHSEED"),
        ({"PYTHONWARNINGS": "error"}, {}, "PYTHONWARNINGS"),
        ({}, {"PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1", "RANK": "3", "CUDA_VISIBLE_DEVICES": "1"}, None),
        ({"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "1"}, None),  # applied as a count
        ({}, {"OMP_NUM_THREADS": "4"}, None),
        ({"OMP_NUM_THREADS": "2"}, {}, "OMP_NUM_THREADS"),  # the default: only a fresh start knows it
        ({}, {"OMP_NUM_THREADS": "2,1"}, "OMP_NUM_THREADS"),
        ({}, {"OPENBLAS_NUM_THREADS": "3"}, None),
        ({"LANG": "C.UTF-8"}, {"LANG": "de_DE.UTF-8"}, "LANG"),
        ({}, {"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX"),
        ({}, {"TORCH_SHOW_CPP_STACKTRACES": "1"}, "TORCH_SHOW_CPP_STACKTRACES"),
        ({}, {"LD_PRELOAD": "/x.so"}, "LD_PRELOAD"),
        ({}, {"KMP_AFFINITY": "compact"}, "KMP_AFFINITY"),  # where Intel's OpenMP is loaded
    ],
)
def test_what_a_fork_cannot_honour_makes_the_child_exec(server, request_env, differs):  # type: ignore[no-untyped-def]
    assert startup_difference(server, request_env) == differs


def test_intel_openmp_settings_matter_only_where_it_is_loaded():
    # torch's CPU wheels bring GNU OpenMP; scikit-learn's threadpoolctl sets KMP_DUPLICATE_LIB_OK as it loads
    loaded = "libiomp" in Path("/proc/self/maps").read_text()
    expected = "KMP_DUPLICATE_LIB_OK" if loaded else None
    assert startup_difference({}, {"KMP_DUPLICATE_LIB_OK": "True"}, startup_prefixes()) == expected


def test_a_child_rewrites_its_command_line_and_environment_block():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # in a fork of the test process, whose argument area is the test's own
        try:
            fits = set_cmdline(["/usr/bin/python", "-m", "hpctrain.worker", "/runs/a"])
            too_long = set_cmdline(["x" * (areas()[0] + 1)])
            os.environ.clear()  # C's environ must not point into the block it rewrites
            os.environ["A"] = "1"
            rewritten = set_environ_block({"A": "1"})
            with open("/proc/self/cmdline", "rb") as f, open("/proc/self/environ", "rb") as g:
                found = (fits, too_long, rewritten, f.read().rstrip(b"\0"), g.read().rstrip(b"\0"))
                os.write(write, repr(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    fits, too_long, rewritten, cmdline, environ = eval(os.read(read, 1 << 16))
    assert fits and not too_long and rewritten
    assert cmdline.split(b"\0") == [b"/usr/bin/python", b"-m", b"hpctrain.worker", b"/runs/a"]
    assert environ == b"A=1"


BAD_PATHS = [("", "not a socket path"), ("/x/s\x07.sock", "not a socket path"), ("MISSING", "no such file")]


@pytest.mark.parametrize(("value", "words"), BAD_PATHS, ids=["empty", "control character", "missing"])
def test_a_bad_socket_path_is_one_line(tmp_path: Path, value: str, words: str):
    value = value.replace("MISSING", str(tmp_path / "gone.sock"))
    with pytest.raises(ConfigError) as err:
        check_socket_path(value)
    line = str(err.value)
    assert line.startswith(f"{FORKSERVER_ENV}=") and words in line and "\n" not in line
    assert "python -m hpctrain.forkserver --socket PATH" in line and "off" in line
    assert "\x07" not in line


def test_a_regular_file_is_not_a_socket(tmp_path: Path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="not a socket"):
        check_socket_path(str(tmp_path / "f"))


def test_a_server_of_other_code_is_named():
    ours = identity()
    assert mismatch(ours, ours) is None
    assert "it runs hpctrain from /elsewhere" in str(mismatch({**ours, "package": "/elsewhere"}, ours))
    assert "it runs hpctrain 9.9" in str(mismatch({**ours, "version": "9.9"}, ours))
    assert "it runs Python /opt/py" in str(mismatch({**ours, "python": "/opt/py"}, ours))
    assert "sources changed since it started" in str(mismatch({**ours, "sources": "0"}, ours))


@pytest.mark.parametrize(
    ("argv", "local"),
    [
        ([], True),
        (["model=vit", "cluster.nproc=4", "-m", "optim.lr=1e-3,2e-3"], True),
        (["cluster=local"], True),
        (["cluster=a100x32"], False),
        (["++cluster=slurm_test"], False),
        (["dry_run=true"], False),
        (["--cfg", "job"], False),
        (["cluster.fork_server=false"], False),
    ],
)
def test_the_cli_starts_a_server_early_only_for_what_looks_local(argv: list[str], local: bool):
    assert looks_local(argv) is local


def test_no_server_when_turned_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(FORKSERVER_ENV, raising=False)
    assert server_for(False) == (None, False)
    monkeypatch.setenv(FORKSERVER_ENV, "off")
    assert server_for(True) == (None, False)


def test_a_request_carries_what_a_spawned_worker_inherits():
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        state = launcher_state()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
    assert signal.SIGUSR1 in state["ignored"] and signal.SIGPIPE not in state["ignored"]
    assert signal.SIGUSR2 in state["sigmask"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert state["umask"] == umask
    assert state["affinity"] == sorted(os.sched_getaffinity(0))
    assert set(state["limits"]) >= {"RLIMIT_NOFILE", "RLIMIT_CORE"}


def _scripted_server() -> tuple[ForkServer, socket.socket, MessageReader]:
    """A client on one end of a socket pair; the test answers on the other, as a server would."""
    ours, theirs = socket.socketpair()
    client = ForkServer(ours, "at the test's end")
    reader = MessageReader(theirs)
    assert _read_all(reader)[0][0]["op"] == "hello"
    send_message(theirs, {"op": "hello", "pid": 4242, "identity": identity()})
    return client, theirs, reader


def test_the_client_follows_a_child_from_start_to_exit(tmp_path: Path):
    client, theirs, reader = _scripted_server()
    answer = _answer(theirs, {"op": "started", "id": 1, "pid": 777, "mode": "fork"})
    with open(tmp_path / "log", "wb") as out:
        handle = client.spawn("hpctrain.worker", ["/run"], {"A": "1"}, out.fileno())
    answer.join()
    (request, fds), *_ = _read_all(reader)
    assert request["op"] == "spawn" and request["env"] == {"A": "1"} and request["args"] == ["/run"]
    assert len(fds) == 1 and request["cwd"] == os.getcwd()
    assert (client.pid, handle.pid, handle.mode, handle.poll()) == (4242, 777, "fork", None)
    send_message(theirs, {"op": "exit", "id": 1, "returncode": -signal.SIGKILL})
    assert handle.wait(timeout=5) == -signal.SIGKILL and handle.poll() == -signal.SIGKILL
    theirs.close()
    client.pump(0.1)  # a hang-up once every child has exited is the end of the conversation, not an error


def test_a_hang_up_with_children_running_names_the_server(tmp_path: Path):
    client, theirs, _ = _scripted_server()
    answer = _answer(theirs, {"op": "started", "id": 1, "pid": 777, "mode": "fork"})
    with open(tmp_path / "log", "wb") as out:
        handle = client.spawn("hpctrain.worker", ["/run"], {}, out.fileno())
    answer.join()
    theirs.close()
    with pytest.raises(ServerGone) as err:
        handle.poll()
    assert (
        str(err.value)
        == "the fork server (pid 4242) at the test's end died; the workers it started died with it"
    )


def test_a_server_of_other_code_is_refused_at_hello():
    ours, theirs = socket.socketpair()
    client = ForkServer(ours, "at /s.sock")
    send_message(theirs, {"op": "hello", "pid": 1, "identity": {**identity(), "package": "/elsewhere"}})
    with pytest.raises(
        ServerMismatch, match=r"not forking from the fork server at /s\.sock: it runs hpctrain from"
    ):
        client.ready(timeout=5)


def test_a_refused_request_is_one_line(tmp_path: Path):
    client, theirs, _ = _scripted_server()
    refusal = {"op": "error", "id": 1, "message": "fork: [Errno 11] Resource temporarily unavailable"}
    answer = _answer(theirs, refusal)
    with open(tmp_path / "log", "wb") as out, pytest.raises(ForkServerError) as err:
        client.spawn("hpctrain.worker", ["/run"], {}, out.fileno())
    answer.join()
    assert str(err.value).startswith("the fork server at the test's end could not start a worker: fork:")


def test_prestart_is_skipped_where_a_server_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(FORKSERVER_ENV, "/some/s.sock")
    forked.prestart([])
    assert forked._prestarted is None


def test_a_server_that_ends_before_its_hello_is_named():
    ours, theirs = socket.socketpair()
    client = ForkServer(ours, "started by this launch")
    theirs.close()
    with pytest.raises(
        ServerGone, match=r"^the fork server started by this launch ended before it was ready$"
    ):
        client.ready(timeout=5)
