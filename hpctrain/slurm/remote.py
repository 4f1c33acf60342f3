"""Slurm from a laptop: ``cluster.ssh=[USER@]HOST`` runs Slurm's clients, and hpctrain's own commands on a
submitted run, on the cluster's login node over ONE multiplexed OpenSSH connection, and ships files there.

- One connection: every ssh here shares a master connection (``ControlMaster=auto``, ``ControlPersist``),
  whose socket lives in a folder of ours that only the user can enter (:func:`control_dir`, mode 0700), one
  per ssh config file: the first command pays for the login, the next ones only for the remote shell.
- No password, ever: ``BatchMode=yes`` makes ssh fail instead of asking, so only the user's keys or agent
  log in, and nothing of theirs is stored by hpctrain. Host keys are checked as the user's ssh config says
  (``StrictHostKeyChecking`` is theirs); ``cluster.ssh_config`` names another config file (``ssh -F``), where
  a port, a key, a known_hosts file or a ProxyJump go, as in ``~/.ssh/config``.
- Quoting: a remote command is a list of words, joined with :func:`shlex.join` for the remote login shell
  (a POSIX shell: sh, bash, zsh), so no value is ever read as shell syntax there.
- An ssh failure (exit status 255: host unreachable, host key mismatch, login refused) is
  :class:`RemoteError`, one line naming ``cluster.ssh`` and the host.

Files go with rsync over the same connection when both ends have it (``rsync -e 'ssh ...'``), else as a tar
stream piped through ssh. Torch-free, and nothing here imports the rest of hpctrain: :mod:`commands` runs
Slurm's clients through :class:`Remote`, the launcher ships with it, ``hpctrain status|logs|cancel|summary``
forward through it (:mod:`hpctrain.jobs.targets`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# [USER@]HOST: a host name, an address or a Host alias of the ssh config. Nothing that ssh or a shell would
# read as an option or syntax: no leading "-" (``-oProxyCommand=...``), no spaces, no ":" or "/".
DESTINATION = re.compile(r"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*)@)?(?P<host>[A-Za-z0-9_][A-Za-z0-9._-]*)")
DESTINATION_HELP = "[USER@]HOST: a host name, an address or a Host alias of your ssh config"
CONTROL_PERSIST = "10m"  # the master connection outlives the last command by this long
CONNECT_TIMEOUT_S = 15
SSH_FAILED = 255  # ssh's own exit status (the remote command's is passed through)


class RemoteError(RuntimeError):
    """ssh itself failed (unreachable host, host key, login): one line naming cluster.ssh and the host."""


def destination_problem(value: str) -> str | None:
    """Why ``value`` is no ``cluster.ssh`` destination; None when it is one."""
    if not value.strip():
        return "empty"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "contains a control character"
    if value.startswith("-"):
        return "starts with '-': ssh would read it as an option"
    if value.endswith("@") or value.startswith("@"):
        return "no host" if value.endswith("@") else "no user before @"
    if not DESTINATION.fullmatch(value):
        return "not [USER@]HOST (letters, digits and . _ - only)"
    return None


def control_dir() -> Path:
    """The folder of the master connections' sockets: ours, the user's alone (0700), short enough for a Unix
    socket's path (``%C`` adds 40 characters). A folder that another user owns or others may enter is
    refused: its sockets would hand them the connection."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    path = base / f"hpctrain-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RemoteError(f"{path}: not a folder of yours that only you can enter (mode 0700): remove it")
    return path


@dataclass(frozen=True)
class Done:
    """How a remote command ended: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass(frozen=True)
class Remote:
    """The cluster's login node as ``cluster.ssh`` and ``cluster.ssh_config`` name it."""

    destination: str
    config_file: str | None = None

    @property
    def host(self) -> str:
        return self.destination.rpartition("@")[2]

    @property
    def user(self) -> str | None:
        user, at, _ = self.destination.rpartition("@")
        return user if at else None

    def ssh(self) -> list[str]:
        """ssh and its options, without the destination (also rsync's ``-e``)."""
        argv = ["ssh"]
        if self.config_file:
            argv += ["-F", self.config_file]
        options = {
            "BatchMode": "yes",  # fail rather than ask for a password or a passphrase
            "ControlMaster": "auto",
            "ControlPath": str(control_dir() / f"{self._config_tag()}-%C"),
            "ControlPersist": CONTROL_PERSIST,
            "ConnectTimeout": str(CONNECT_TIMEOUT_S),
            "ServerAliveInterval": "30",  # a connection that died (laptop asleep) is noticed, not waited on
        }
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return argv

    def _config_tag(self) -> str:
        """Part of the master connection's name: ssh's ``%C`` hashes the host, port and user only, and a
        connection made under one config (its known_hosts, its key) must not serve another."""
        return hashlib.sha256(os.fsencode(self.config_file or "")).hexdigest()[:8]

    def argv(self, words: Sequence[str]) -> list[str]:
        """The local command that runs ``words`` on the login node ("--": the destination is no option)."""
        return [*self.ssh(), "--", self.destination, shlex.join(words)]

    def run(self, words: Sequence[str], timeout: float = 60, input: str | None = None) -> Done:
        """Run ``words`` there and wait; RemoteError when ssh itself failed."""
        done = _call(self.argv(words), timeout, input)
        if done.timed_out:
            raise RemoteError(
                f"cluster.ssh={self.destination}: {' '.join(words[:2])} on {self.host} did not "
                f"answer within {timeout:.0f} s"
            )
        if done.returncode == SSH_FAILED:
            raise RemoteError(self.failure(done.stderr))
        return done

    def connect(self) -> None:
        """Open (or reuse) the master connection; RemoteError with the reason when it cannot."""
        self.run(["true"], timeout=CONNECT_TIMEOUT_S + 15)

    def forward(self, words: Sequence[str]) -> int:
        """Run ``words`` there with this process's stdin, stdout and stderr (``logs -f`` streams): its exit
        status. The connection is checked first, so that an ssh failure is one line, not ssh's own words."""
        self.connect()
        return subprocess.run(self.argv(words), check=False).returncode

    def failure(self, stderr: str) -> str:
        """ssh's failure as one line naming cluster.ssh and the host."""
        lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("@")]
        last = lines[-1] if lines else "ssh failed"
        head = f"cluster.ssh={self.destination}"
        if "host key" in stderr.lower() or "HOST IDENTIFICATION HAS CHANGED" in stderr:
            return (
                f"{head}: the host key of {self.host} does not match your known_hosts ({last}); if the host"
                f" really changed its key, remove the old one with ssh-keygen -R {self.host}"
            )
        if "Permission denied" in stderr or "Too many authentication failures" in stderr:
            return (
                f"{head}: {self.host} refused the login ({last}); hpctrain logs in with your keys or agent"
                " only (BatchMode), never with a password"
            )
        return f"{head}: cannot reach {self.host} ({last})"

    def close(self) -> None:
        """End the master connection (``ssh -O exit``); nothing when there is none."""
        _call([*self.ssh(), "-O", "exit", "--", self.destination], 30, None)

    # -------------------------------------------------------------------------------------- files
    def write_file(self, path: str, text: str) -> None:
        """Write ``text`` to ``path`` there, whole or not at all (a temporary file renamed over it)."""
        script = 'umask 077 && cat > "$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"'
        done = self.run(["sh", "-c", script, "sh", path], input=text)
        if done.returncode != 0:
            raise RemoteError(
                f"cluster.ssh={self.destination}: cannot write {path} on {self.host}: "
                f"{_last_line(done.stderr)}"
            )

    def ship(self, local: Path, remote: str, rsync: bool | None = None) -> str:
        """Copy the folder ``local`` into the folder ``remote`` there (made if missing; files already there
        are overwritten, none removed): with rsync when both ends have it (or as ``rsync`` says), else as a
        tar stream. Returns the way taken: "rsync" or "tar"."""
        probe = 'mkdir -p -- "$1" && if command -v rsync >/dev/null 2>&1; then echo rsync; else echo tar; fi'
        done = self.run(["sh", "-c", probe, "sh", remote], timeout=60)
        if done.returncode != 0:
            raise RemoteError(
                f"cluster.ssh={self.destination}: cannot make {remote} on {self.host}: "
                f"{_last_line(done.stderr)}"
            )
        if rsync is None:
            rsync = done.stdout.strip() == "rsync" and shutil.which("rsync") is not None
        if rsync:
            # --protect-args: the remote path travels inside rsync's protocol, not through the remote shell.
            argv = [
                "rsync",
                "--archive",
                "--protect-args",
                "-e",
                shlex.join(self.ssh()),
                "--",
                f"{local}/",
                f"{self.destination}:{remote}/",
            ]
            copied = _call(argv, 600, None)
            way = "rsync"
        else:
            copied = _tar_through(local, self.argv(["tar", "-C", remote, "-xf", "-"]))
            way = "tar"
        if copied.returncode == SSH_FAILED and not copied.timed_out:
            raise RemoteError(self.failure(copied.stderr))
        if copied.returncode != 0:
            why = "timed out" if copied.timed_out else _last_line(copied.stderr)
            raise RemoteError(
                f"cluster.ssh={self.destination}: copying {local} to {self.host}:{remote} "
                f"failed ({way}): {why}"
            )
        return way

    def fetch(self, remote: str, local: Path) -> None:
        """Copy the files of the folder ``remote`` there into the folder ``local`` here (made if missing), as
        a tar stream over the connection; RemoteError when either end fails."""
        local.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile("w+") as err:
            packing = self.argv(["tar", "-C", remote, "-cf", "-", "."])
            sender = subprocess.Popen(packing, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=err)
            assert sender.stdout is not None
            try:  # --no-same-owner: the files are the user's here, whoever owned them there
                unpacked = subprocess.run(
                    ["tar", "-C", str(local), "--no-same-owner", "-xf", "-"],
                    stdin=sender.stdout,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                sender.kill()
                why = f"cluster.ssh={self.destination}: copying {self.host}:{remote} timed out"
                raise RemoteError(why) from None
            finally:
                sender.stdout.close()
                sender.wait()
            err.seek(0)
            why = err.read()
        if sender.returncode == SSH_FAILED:
            raise RemoteError(self.failure(why))
        if sender.returncode != 0 or unpacked.returncode != 0:
            raise RemoteError(
                f"cluster.ssh={self.destination}: copying {self.host}:{remote} to {local} "
                f"failed: {_last_line(why or unpacked.stderr)}"
            )


def remote_run_dir(run_dir: Path, remote_dir: str | None, submit_dir: Path) -> PurePosixPath:
    """Where the run directory ``run_dir`` is on the cluster: the same path without ``remote_dir``; else
    ``remote_dir`` / its path below the submit directory (``outputs/2026-11-26/12-00-00``), or / its name
    when it is not below it."""
    if remote_dir is None:
        return PurePosixPath(run_dir.as_posix())
    try:
        below = run_dir.relative_to(submit_dir)
    except ValueError:
        below = Path(run_dir.name)
    return PurePosixPath(remote_dir) / below.as_posix()


def _call(argv: list[str], timeout: float, input: str | None) -> Done:
    """Run ``argv`` with its output in temporary files, not pipes: a master connection that ssh leaves in
    the background must not keep a pipe of ours open (the call would wait for it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            result = subprocess.run(
                argv,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            out.seek(0)
            err.seek(0)
            return Done(SSH_FAILED, out.read(), err.read(), timed_out=True)
        out.seek(0)
        err.seek(0)
        return Done(result.returncode, out.read(), err.read())


def _tar_through(local: Path, ssh_argv: list[str]) -> Done:
    """``tar -C local -cf - . | ssh ... tar -xf -``: the receiving side's status, or tar's when it failed."""
    with tempfile.TemporaryFile("w+") as err:
        packer = subprocess.Popen(
            ["tar", "-C", str(local), "-cf", "-", "."], stdout=subprocess.PIPE, stderr=err
        )
        assert packer.stdout is not None
        try:
            receiver = subprocess.run(
                ssh_argv, stdin=packer.stdout, stdout=subprocess.DEVNULL, stderr=err, timeout=600, check=False
            )
        except subprocess.TimeoutExpired:
            packer.kill()
            return Done(SSH_FAILED, "", "", timed_out=True)
        finally:
            packer.stdout.close()
            packer.wait()
        err.seek(0)
        code = receiver.returncode or packer.returncode
        return Done(code, "", err.read())


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
