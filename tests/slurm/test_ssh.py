"""Submitting from a laptop (``cluster.ssh``) through a real OpenSSH server, to the real test cluster.

The "laptop" is this process's children WITHOUT SLURM_CONF, with a PATH whose Slurm clients only record that
they were called (every Slurm command must go over ssh). The "login node" is an sshd on a loopback port of
this machine, started by the module fixture with a host key, a client key pair and a known_hosts file made
here; the sessions it starts have the cluster's SLURM_CONF (sshd_config's SetEnv), as a login node's shell
has it. ``cluster.remote_dir`` puts the run directory in another folder there, so what ``status``, ``logs``,
``summary`` and ``cancel`` show can only have come through ssh. One sweep of 2 tiny members (1 rank each)
as a job array (logs -f, status, summary, report, save, stop and cancel of it and its members from the
laptop), one held single run to cancel, and the refusals: a host key that does not match, a port where
nothing listens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.slurm.commands import cancel, job_states
from hpctrain.slurm.remote import Remote
from tests.support import FAST, REPO, this_checkout_first

from .cluster import SlurmTestCluster

SSHD = "/usr/sbin/sshd"
DEST = "root@127.0.0.1"
SLURM_CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun", "sacctmgr")


def _ensure_sshd() -> None:
    """Debian's openssh-server, installed as tests/slurm/cluster.py installs Slurm (root, apt)."""
    if Path(SSHD).is_file() and shutil.which("ssh-keygen"):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("openssh-server is missing and cannot be installed here (not root, or no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "openssh-server"]
    for cmd in (["apt-get", "update"], install):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Login:
    """The sshd standing in for the cluster's login node, and the files a laptop's user would have."""

    root: Path
    port: int
    config: Path  # the laptop's ssh config (cluster.ssh_config): port, key, known_hosts
    env: dict[str, str]  # the laptop's environment: no SLURM_CONF, Slurm clients that only tell on us
    called: Path  # where those clients write their name when called

    def ssh_config(self, name: str, port: int, known_hosts: Path) -> Path:
        path = self.root / f"{name}.ssh_config"
        path.write_text(
            f"Host 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {self.root / 'id_client'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
        )
        return path


@pytest.fixture(scope="module")
def login(slurm_cluster: SlurmTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Login]:
    _ensure_sshd()
    root = tmp_path_factory.mktemp("ssh")
    root.chmod(0o700)
    host_key = _keygen(root / "host_key")
    client_key = _keygen(root / "id_client")
    (root / "authorized_keys").write_text(client_key + "\n")
    port = _free_port()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    # The login node's shell: the cluster's configuration and clients (its startup files may still put another
    # python first on PATH, as root's ~/.bashrc does here: the jobs' cluster.setup line picks the venv's).
    cluster_path = os.pathsep.join([str(Path(sys.executable).parent), slurm_cluster.env()["PATH"]])
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"SetEnv SLURM_CONF={slurm_cluster.conf_path} PATH={cluster_path}\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    sshd = subprocess.Popen([SSHD, "-D", "-f", str(root / "sshd_config"), "-E", str(root / "sshd.log")])
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert sshd.poll() is None and time.monotonic() < deadline, "sshd did not start"
        time.sleep(0.1)
    # The laptop: Slurm clients on its PATH only record the call; no SLURM_CONF.
    fakes = root / "laptop-bin"
    fakes.mkdir()
    called = root / "called"
    for name in SLURM_CLIENTS:
        (fakes / name).write_text(f"#!/bin/sh\necho {name} >> {called}\nexit 1\n")
        (fakes / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(PATH=f"{fakes}{os.pathsep}{env['PATH']}", PYTHONPATH=this_checkout_first())
    made = Login(root, port, root / "laptop.ssh_config", env, called)
    made.ssh_config("laptop", port, root / "known_hosts")
    try:
        yield made
    finally:
        Remote(DEST, str(made.config)).close()
        sshd.send_signal(signal.SIGTERM)
        sshd.wait(timeout=10)


def laptop(login: Login, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m hpctrain ARGS`` on the laptop."""
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=REPO,
        env=login.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _overrides(login: Login, config: Path | None = None) -> list[str]:
    return [
        "cluster=slurm_test",
        f"cluster.ssh={DEST}",
        f"cluster.ssh_config={config or login.config}",
        f"cluster.remote_dir={login.root / 'cluster'}",
        "cluster.nodes=1",
        "cluster.tasks_per_node=1",
        # What a user's profile does on their cluster: the job's (and hpctrain.sh's) interpreter is the
        # venv's, whatever the login shell's startup put first on PATH (root's ~/.bashrc here: pyenv's shims).
        f"cluster.setup=['export PATH={Path(sys.executable).parent}:$PATH']",
    ]


def test_a_sweep_submitted_over_ssh_is_looked_after_from_the_laptop(login: Login) -> None:
    local = login.root / "laptop" / "sweep"
    sweep = ["-m", "trainer.max_steps=6,20000", "trainer.log_every=1", *FAST, f"hydra.sweep.dir={local}"]
    submitted = laptop(login, *_overrides(login), *sweep)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    record = json.loads((local / "sweep.json").read_text())
    there = login.root / "cluster" / "sweep"
    assert record["ssh"] == DEST and record["remote_sweep_dir"] == str(there)
    jobs = [m["job_id"] for m in record["members"]]
    assert jobs == [f"{record['array_job_id']}_0", f"{record['array_job_id']}_1"], jobs
    # The login node's copies: the array's script, the code snapshot, login-node records (no ssh in them).
    assert (there / "array-0.sbatch").is_file() and (there / "code" / "hpctrain" / "worker.py").is_file()
    assert json.loads((there / "sweep.json").read_text())["ssh"] is None
    assert json.loads((there / "1" / "job.json").read_text())["job_id"] == jobs[1]
    try:
        # logs -f streams member 0's rank 0 log through ssh until its job ends.
        followed = laptop(login, "logs", str(local / "0"), "-f", "-n", "100", timeout=240)
        assert followed.returncode == 0 and "step 6" in followed.stdout, (
            followed.stdout[-2000:] + followed.stderr
        )
        member = laptop(login, "status", str(local / "0"))
        assert re.search(r"^step\s+6/6", member.stdout, re.M) and jobs[0] in member.stdout, member.stdout
        # What logs and status showed came from the cluster's run directory: the laptop's has no metrics.
        assert (there / "0" / "metrics.jsonl").is_file() and not (local / "0" / "metrics.jsonl").exists()
        one = laptop(login, "summary", str(local / "0"))  # a member is no sweep: the cluster's one line
        assert one.returncode == 1 and "not a sweep directory" in one.stderr.strip(), one.stderr
        deadline = time.monotonic() + 240
        while not (there / "1" / "metrics.jsonl").is_file():  # member 1 (20000 steps) trains
            assert time.monotonic() < deadline, laptop(login, "status", str(local)).stdout
            time.sleep(1)
        saved = laptop(login, "save", str(local / "1"), "--wait", "120", timeout=200)
        assert saved.returncode == 0 and "the run trains on" in saved.stdout, saved.stdout + saved.stderr
        stopped = laptop(login, "stop", str(local / "1"), "--wait", "120", timeout=200)
        assert stopped.returncode == 0 and "stopped (no requeue)" in stopped.stdout, stopped.stderr
        deadline = time.monotonic() + 240
        while not all(s.final for s in job_states(jobs).values()):
            assert time.monotonic() < deadline, job_states(jobs)
            time.sleep(1)
    finally:
        cancel(jobs)
    status = laptop(login, "status", str(local))
    assert status.returncode == 0 and all(job in status.stdout for job in jobs), status.stdout + status.stderr
    summary = laptop(login, "summary", str(local))
    assert summary.returncode == 0 and f"wrote {there / 'summary.csv'}" in summary.stdout, summary.stderr
    assert "trainer.max_steps=6" in summary.stdout and "trainer.max_steps=20000" in summary.stdout
    report = laptop(login, "report", str(local))
    assert report.returncode == 0 and f"copied the pictures to {local / 'report'}" in report.stdout, (
        report.stderr
    )
    assert (local / "report" / "sweep_loss.png").is_file() or list((local / "report").glob("*.png"))
    # A member that has ended: the cluster's own refusal, in one line naming the run there.
    again = laptop(login, "stop", str(local / "0"), "--wait", "0")
    assert again.returncode == 1 and f"{there / '0'}: the run is not running" in again.stderr, again.stderr
    cancelled = laptop(login, "cancel", str(local))
    assert cancelled.returncode == 0, cancelled.stderr
    assert not login.called.exists(), f"a Slurm client ran on the laptop: {login.called.read_text()}"


def test_cancel_from_the_laptop(login: Login) -> None:
    local = login.root / "laptop" / "held"
    held = ["trainer.max_steps=2", *FAST, "cluster.additional.hold=true", f"hydra.run.dir={local}"]
    submitted = laptop(login, *_overrides(login), *held)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    record = json.loads((local / "job.json").read_text())
    job_id, remote_dir = record["job_id"], login.root / "cluster" / "held"
    assert record["ssh"] == DEST and record["remote_run_dir"] == str(remote_dir)
    # The login node's copy: the script, the code snapshot, a login node's record (no ssh in it).
    assert (remote_dir / "job.sbatch").is_file() and (
        remote_dir / "code" / "hpctrain" / "worker.py"
    ).is_file()
    assert json.loads((remote_dir / "job.json").read_text())["ssh"] is None
    status = laptop(login, "status", str(local))
    assert "PENDING" in status.stdout and "JobHeldUser" in status.stdout, status.stdout + status.stderr
    cancelled = laptop(login, "cancel", str(local))
    assert cancelled.returncode == 0 and f"cancelled job {job_id}" in cancelled.stdout, cancelled.stderr
    deadline = time.monotonic() + 30
    while job_states([job_id])[job_id].state != "CANCELLED":  # accounting records it within a moment
        assert time.monotonic() < deadline, job_states([job_id])
        time.sleep(0.5)
    assert not login.called.exists(), f"a Slurm client ran on the laptop: {login.called.read_text()}"


def test_a_wrong_host_key_and_an_unreachable_host_are_one_line_each(login: Login) -> None:
    other_key = _keygen(login.root / "other_host_key")
    wrong = login.root / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{login.port} {other_key}\n")
    cases = {
        "host key": login.ssh_config("wrong", login.port, wrong),
        "cannot reach 127.0.0.1": login.ssh_config("closed", _free_port(), login.root / "known_hosts"),
    }
    for words, config in cases.items():
        run_dir = login.root / "laptop" / config.stem
        result = laptop(login, *_overrides(login, config), f"hydra.run.dir={run_dir}")
        line = result.stderr.strip()
        assert result.returncode != 0 and "\n" not in line, result.stderr
        assert f"cluster.ssh={DEST}" in line and words in line and "Traceback" not in line, line
        assert not run_dir.exists()  # refused before Hydra made the run directory


def test_a_secret_in_cluster_env_is_refused_over_ssh(login: Login) -> None:
    # A secret reaches a job from sbatch's environment: over ssh, the login node's, never the laptop's.
    run_dir = login.root / "laptop" / "secret"
    result = laptop(login, *_overrides(login), "+cluster.env.API_TOKEN=s3cr3t", f"hydra.run.dir={run_dir}")
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line and "cluster.env.API_TOKEN" in line, result.stderr
    assert "s3cr3t" not in result.stdout + result.stderr and not run_dir.exists()
    assert not (login.root / "cluster" / "secret").exists()  # nothing shipped


def test_files_go_by_rsync_or_by_tar_alike(login: Login) -> None:
    source = login.root / "tree"
    (source / "sub dir").mkdir(parents=True)
    (source / "a.txt").write_text("a")
    (source / "sub dir" / "b'; touch pwned #").write_text("b")
    remote = Remote(DEST, str(login.config))
    for way in ("rsync", "tar"):
        target = login.root / "shipped" / f"{way} $(touch pwned)"
        assert remote.ship(source, str(target), rsync=way == "rsync") == way
        copied = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
        assert copied == sorted(str(p.relative_to(source)) for p in source.rglob("*"))
        assert (target / "sub dir" / "b'; touch pwned #").read_text() == "b"
    assert not list(login.root.rglob("pwned")) and not (Path.home() / "pwned").exists()
