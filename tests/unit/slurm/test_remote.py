"""``cluster.ssh`` without a server (hpctrain.slurm.remote, the keys' rules): the destinations ssh could read
as an option or that name no host, the command a remote shell gets (each word quoted), ssh's failures as one
line, where the run directory goes, and the refusals of the keys through the command line. The real server,
the shipping and the commands through it: tests/slurm/test_ssh.py."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from hpctrain.slurm.commands import check_client, remote, use_remote
from hpctrain.slurm.remote import Remote, control_dir, destination_problem, remote_run_dir


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty"),
        ("root@", "no host"),
        ("@host", "no user"),
        ("-oProxyCommand=touch /tmp/x", "option"),
        ("login\n-oProxyCommand=x", "control character"),
        ("user@host name", "not [USER@]HOST"),
        ("user@host:22", "not [USER@]HOST"),
        ("a@b@c", "not [USER@]HOST"),
    ],
)
def test_a_destination_ssh_could_misread_is_refused(value: str, problem: str) -> None:
    found = destination_problem(value)
    assert found is not None and problem in found


@pytest.mark.parametrize("value", ["login1", "alice@login.cluster.example.org", "bob@10.0.0.5", "my_alias"])
def test_destinations(value: str) -> None:
    assert destination_problem(value) is None


def test_each_word_reaches_the_remote_shell_as_one_word(tmp_path: Path) -> None:
    remote = Remote("alice@login1", str(tmp_path / "config"))
    words = ["sbatch", "--parsable", "/runs/a b/$(touch x);`id`'\"/job.sbatch"]
    argv = remote.argv(words)
    assert argv[:3] == ["ssh", "-F", str(tmp_path / "config")]
    assert argv[-3:-1] == ["--", "alice@login1"]  # "--": the destination is never an option
    assert shlex.split(argv[-1]) == words  # what a POSIX login shell makes of the command line
    options = dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "-o")
    assert options["BatchMode"] == "yes" and options["ControlMaster"] == "auto"
    assert options["ControlPath"].startswith(str(control_dir())) and "StrictHostKeyChecking" not in options
    # A connection made under one ssh config (its known_hosts, its key) never serves another.
    argvs = [Remote("alice@login1", c).argv(["true"]) for c in (None, "/a/config", "/b/config")]
    assert len({w for argv in argvs for w in argv if w.startswith("ControlPath=")}) == 3
    # A real POSIX shell splits it back into the same words.
    echoed = subprocess.run(
        ["sh", "-c", f"printf '%s\\n' {argv[-1].split(' ', 1)[1]}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.splitlines() == words[1:]


def test_the_control_folder_is_ours_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = control_dir()
    assert folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)  # others could reach the sockets: refused, one line
    with pytest.raises(RuntimeError, match="only you can enter"):
        control_dir()


def test_ssh_failures_are_one_line_naming_the_key_and_the_host() -> None:
    remote = Remote("root@login1")
    mismatch = (
        "@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@@@@@@@\n"
        "Host key for login1 has changed and you have requested strict checking.\n"
        "Host key verification failed.\n"
    )
    cases = {
        mismatch: "host key of login1 does not match",
        "ssh: connect to host login1 port 22: Connection refused\n": "cannot reach login1",
        "root@login1: Permission denied (publickey).\n": "refused the login",
        "": "cannot reach login1 (ssh failed)",
    }
    for stderr, words in cases.items():
        line = remote.failure(stderr)
        assert "\n" not in line and line.startswith("cluster.ssh=root@login1: ") and words in line, line


def test_the_run_directory_on_the_cluster() -> None:
    submit = Path("/home/me/proj")
    run = submit / "outputs" / "2026-11-26" / "12-00-00"
    assert remote_run_dir(run, None, submit) == PurePosixPath(run)
    assert remote_run_dir(run, "/scratch/me", submit) == PurePosixPath(
        "/scratch/me/outputs/2026-11-26/12-00-00"
    )
    assert remote_run_dir(Path("/tmp/x/run"), "/scratch/me", submit) == PurePosixPath("/scratch/me/run")


def test_over_ssh_no_local_client_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="sbatch"):
        check_client()
    login = Remote("root@login1")
    with use_remote(login):
        check_client()  # the login node has the client
        assert remote() == login
    assert remote() is None  # the block ended: here again
    assert os.environ["PATH"] == "/nonexistent"


# (overrides, words the one-line message must contain)
REFUSED = [
    (["cluster.ssh=root@"], ["cluster.ssh=root@", "no host"]),
    (["cluster.ssh=''"], ["cluster.ssh=", "empty"]),
    (["cluster.ssh='-oProxyCommand=touch /tmp/pwned'"], ["cluster.ssh=-oProxyCommand", "option"]),
    (["cluster.ssh='a\\nb'"], ["cluster.ssh=a\\nb"]),  # a backslash or a newline: refused either way
    (["cluster=local", "cluster.ssh=root@login1"], ["cluster.ssh=root@login1", "cluster.kind=local"]),
    (["cluster.ssh=root@login1", "launcher=submitit"], ["launcher=submitit", "valid: sbatch or auto"]),
    (["cluster.ssh_config=/etc/ssh/ssh_config"], ["cluster.ssh_config", "cluster.ssh, which is not set"]),
    (["cluster.ssh=root@login1", "cluster.ssh_config=rel"], ["cluster.ssh_config=rel", "absolute"]),
    (["cluster.ssh=root@login1", "cluster.ssh_config=/nonexistent"], ["cluster.ssh_config", "no such file"]),
    (["cluster.ssh=root@login1", "cluster.remote_dir=runs"], ["cluster.remote_dir=runs", "absolute"]),
    (["cluster.ssh=root@login1", "trainer.eval_job=slurm_test"], ["trainer.eval_job", "cluster.ssh"]),
]


@pytest.mark.parametrize(("overrides", "words"), REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_ssh_keys_are_one_line(cli, tmp_path: Path, overrides: list[str], words: list[str]) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    result = cli("cluster=slurm_test", *overrides, f"hydra.run.dir={run_dir}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert "Traceback" not in result.stdout + result.stderr and not run_dir.exists()
    assert not Path("/tmp/pwned").exists()


def test_a_packed_sweep_over_ssh_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A sweep goes over ssh as sbatch arrays; packs are submitit's tasks, which submit from the laptop.
    result = cli(
        "-m",
        "cluster=slurm_test",
        "cluster.ssh=root@127.0.0.1",
        "cluster.pack=2",
        "trainer.seed=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "cluster.pack=2" in lines[0] and "cluster.ssh" in lines[0] and not (tmp_path / "sweep").exists()
