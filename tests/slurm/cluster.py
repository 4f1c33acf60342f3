"""A real multi-node Slurm cluster on this one machine, for the test suite and for humans.

Every node is its own network + hostname (+ mount) namespace (``node1``, ``node2``, ... at
10.77.0.11, .12, ... on a bridge ``hpct-br0`` whose host side, 10.77.0.1, is the controller
``ctl``; the first free 10.N.0.0/24 if 10.77.0.0/24 is taken), so ``SLURM_JOB_NODELIST``,
hostnames, gloo and rendezvous behave as on a real cluster. Every daemon is private to the
cluster (its own munged, key and socket; with ``accounting=True`` its own MariaDB + slurmdbd, so
``sacct``, which submitit uses for job state, works), on non-default ports (16817-16819), with
all state under the workdir. Needs root; Debian's Slurm packages are installed on first use.

From a shell (root)::

    eval "$(python -m tests.slurm.cluster up --nodes 3)"   # prints `export SLURM_CONF=...`
    sinfo; sbatch -N2 --wrap 'srun hostname'; sacct
    python -m tests.slurm.cluster down                        # same --workdir as `up`

``up`` keeps its state in ``--workdir`` (default /tmp/hpct-slurm): configs, logs, spool, pid
files, the munge key and the MariaDB datadir; ``down`` reads it back and tears everything down.

From Python::

    with SlurmTestCluster(tmp_path, num_nodes=3) as cluster:
        cluster.run(["sinfo"])               # SLURM_CONF is always set for you
        os.environ.update(cluster.env())     # before submitit / sbatch from this process

Only one cluster can run on a machine at a time (fixed bridge, netns names and ports; the owner
is recorded in /run/hpct-slurm-test-cluster.json). Anything
left by a crashed run (``hpct-*`` namespaces and links, daemons carrying this harness's marker
variable) is cleaned before the next start; a cluster whose owner is still alive, or one brought
``up`` from the shell, is never touched: stop it with ``down`` first.

Over 400 lines: one cluster's whole life, as the suite and a human at a shell (``up``/``down``) both drive it:
packages, namespaces and the bridge, munge, MariaDB and slurmdbd, the configs, the daemons, a node's faults (a
stopped slurmd, DOWN and RESUME) and teardown all read and write the one state file under the one lock; split,
each part would reach into the others' state.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

# Every name this harness creates starts with this, so a stale-state sweep can find exactly ours.
PREFIX = "hpct-"
BRIDGE = f"{PREFIX}br0"
CONTROLLER_NAME = "ctl"
CLUSTER_NAME = "hpct"
PARTITION = "debug"
# Set in the environment of every daemon we start (and so of every slurmstepd and job step):
# /proc/<pid>/environ then tells our processes from anybody else's, even after a crash.
MARKER_ENV = "HPCT_SLURM_TEST_CLUSTER"
# Who owns the running cluster; lets a new start tell a crashed run from a live one.
REGISTRY = Path("/run/hpct-slurm-test-cluster.json")
LOCKFILE = Path("/run/hpct-slurm-test-cluster.lock")
DEFAULT_WORKDIR = Path("/tmp/hpct-slurm")
# Non-default ports so a real Slurm installation on the same machine is never disturbed.
SLURMCTLD_PORT = 16817
SLURMD_PORT = 16818
SLURMDBD_PORT = 16819
# Candidate /24s (first three octets); the first one that overlaps nothing in `ip addr`/`ip route`.
SUBNET_CANDIDATES = [f"10.{b}.0" for b in range(77, 100)]
# Subdirectories of workdir that start() recreates; anything else in workdir is left alone.
MANAGED_DIRS = ("etc", "state", "spool", "log", "run", "db", "munge")
# A unix socket path must fit in sun_path (108 bytes, NUL included).
MAX_SOCKET_PATH = 100

# A throw-away database needs no durability: without fsync, mariadb-install-db takes ~0.9 s
# instead of 2-4 s here (smaller redo log, no doublewrite, no flush per commit).
MARIADB_FAST = (
    "--innodb-log-file-size=4M",
    "--innodb-flush-method=nosync",
    "--innodb-doublewrite=0",
    "--innodb-flush-log-at-trx-commit=0",
)
SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
CLIENT_COMMANDS = ("sinfo", "sbatch", "srun", "squeue", "scancel", "scontrol")
CORE_DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey")
ACCOUNTING_BINARIES = ("slurmdbd", "mariadbd", "mariadb-install-db", "sacct", "sacctmgr")
NETWORK_TOOLS = ("ip", "nsenter", "unshare", "hostname", "mount", "setsid")
CORE_PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")


class SlurmClusterError(RuntimeError):
    """The test cluster could not be brought up (the message carries the relevant log tails)."""


# --------------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------------


def _which(name: str) -> str | None:
    # Daemons live in /usr/sbin, which is not on every user's PATH.
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    return shutil.which(name, path=path)


def _missing_binaries(accounting: bool) -> list[str]:
    wanted = [*CORE_DAEMONS, *CLIENT_COMMANDS, *NETWORK_TOOLS]
    if accounting:
        wanted += ACCOUNTING_BINARIES
    return [name for name in wanted if _which(name) is None]


def ensure_packages(accounting: bool = True) -> None:
    """Install Debian's Slurm (+ munge, + slurmdbd/MariaDB) if missing; raise if we cannot."""
    missing = _missing_binaries(accounting)
    if not missing:
        return
    packages = [*CORE_PACKAGES, *(ACCOUNTING_PACKAGES if accounting else ())]
    if _which("ip") is None:
        packages.append("iproute2")
    hint = "apt-get install -y --no-install-recommends " + " ".join(packages)
    if os.geteuid() != 0:
        raise SlurmClusterError(f"missing {', '.join(missing)}; as root run: {hint}")
    if _which("apt-get") is None:
        raise SlurmClusterError(f"missing {', '.join(missing)} and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", *packages],
    ):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise SlurmClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{tail}")
    still = _missing_binaries(accounting)
    if still:
        raise SlurmClusterError(f"still missing after apt-get install: {', '.join(still)}")


# --------------------------------------------------------------------------------------------
# Process helpers
# --------------------------------------------------------------------------------------------


def _sh(cmd: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a host-side admin command (ip, mount, ...)."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise SlurmClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # A zombie has exited; only its parent's wait() is missing (daemons are reparented).
    return state not in ("Z", "X")


def _pid_starttime(pid: int) -> str | None:
    # Field 22 of /proc/<pid>/stat: guards against a recycled pid being taken for the owner.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _marker_of(pid: int) -> str | None:
    """The MARKER_ENV value in a process's environment, or None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = MARKER_ENV.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def _marked_pids(workdir: str | None = None) -> list[int]:
    """Processes started by this harness (for one workdir, or for any when workdir is None)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        marker = _marker_of(int(entry.name))
        if marker is not None and (workdir is None or marker == workdir):
            pids.append(int(entry.name))
    return pids


def _kill_and_wait(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL whatever is left and wait for it."""
    pending = {pid for pid in pids if pid > 1 and pid != os.getpid() and _pid_alive(pid)}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pending and time.monotonic() < deadline:
            pending = {pid for pid in pending if _pid_alive(pid)}
            if pending:
                time.sleep(0.05)
        if not pending:
            return


def _netns_pids(ns: str) -> list[int]:
    proc = _sh(["ip", "netns", "pids", ns], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def _our_netns() -> list[str]:
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _our_links() -> list[str]:
    out = _sh(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        # "7: hpct-v1@if6: <...>" -> "hpct-v1"
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                names.append(name)
    return names


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------------------------
# Registry and stale-state guard
# --------------------------------------------------------------------------------------------


def _read_registry() -> dict[str, Any] | None:
    try:
        data = json.loads(REGISTRY.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _registry_owner_alive(reg: Mapping[str, Any]) -> bool:
    """True when the registered cluster is still wanted by someone."""
    owner = reg.get("owner_pid")
    if owner is None:
        # Brought `up` from the shell: wanted for as long as its controller runs.
        ctld = _read_pid(Path(str(reg.get("workdir", ""))) / "run" / "slurmctld.pid")
        return ctld is not None and _pid_alive(ctld) and _marker_of(ctld) == reg.get("workdir")
    return _pid_alive(int(owner)) and _pid_starttime(int(owner)) == reg.get("owner_start")


def clean_stale_state(workdir: Path | None = None) -> list[str]:
    """Remove what a crashed run of this harness left behind; return a description of it.

    Refuses (SlurmClusterError) when the registered cluster belongs to a live owner other than
    `workdir`'s, so a second test session can never tear down the first one's cluster.
    """
    reg = _read_registry()
    other = reg is not None and reg.get("workdir") != (str(workdir) if workdir else None)
    if reg is not None and other and _registry_owner_alive(reg):
        how = "brought up from the shell" if reg.get("owner_pid") is None else f"pid {reg['owner_pid']}"
        raise SlurmClusterError(
            f"another Slurm test cluster is running (workdir {reg.get('workdir')}, owner {how}); "
            f"stop it first: python -m tests.slurm.cluster down --workdir {reg.get('workdir')}"
        )
    cleaned: list[str] = []
    namespaces = _our_netns()
    # Job steps first, then the daemons: killing slurmd first would orphan slurmstepd/srun.
    for ns in namespaces:
        pids = _netns_pids(ns)
        if pids:
            cleaned.append(f"{len(pids)} process(es) in netns {ns}")
            _kill_and_wait(pids, grace=1.0)
    marked = _marked_pids()
    if marked:
        cleaned.append(f"{len(marked)} harness daemon(s)")
        _kill_and_wait(marked, grace=2.0)
    for ns in namespaces:
        _sh(["ip", "netns", "del", ns], check=False)
        cleaned.append(f"netns {ns}")
    for link in _our_links():
        _sh(["ip", "link", "del", link], check=False)
        cleaned.append(f"link {link}")
    if reg is not None:
        REGISTRY.unlink(missing_ok=True)
    return cleaned


def _pick_subnet() -> str:
    """First candidate /24 that overlaps no address or route already on this machine."""
    taken: list[ipaddress.IPv4Network] = []
    for cmd in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for token in _sh(cmd, check=False).stdout.split():
            try:
                net = ipaddress.ip_network(token, strict=False)
            except ValueError:
                continue
            if isinstance(net, ipaddress.IPv4Network) and not net.is_loopback and net.prefixlen > 0:
                taken.append(net)
    for prefix in SUBNET_CANDIDATES:
        candidate = ipaddress.IPv4Network(f"{prefix}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return prefix
    raise SlurmClusterError(f"no free /24 among {SUBNET_CANDIDATES[0]}.0 .. {SUBNET_CANDIDATES[-1]}.0")


# --------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------


class SlurmTestCluster:
    """A Slurm controller, `num_nodes` slurmd nodes in their own namespaces, optional accounting."""

    def __init__(
        self, workdir: Path, num_nodes: int = 3, cpus_per_node: int = 2, accounting: bool = True
    ) -> None:
        if not 1 <= num_nodes <= 200:
            raise ValueError(f"num_nodes must be in 1..200, got {num_nodes}")
        self.workdir = Path(workdir).resolve()
        self.num_nodes = num_nodes
        self.cpus_per_node = cpus_per_node
        self.accounting = accounting
        self._subnet: str | None = None
        self._sockdir: Path | None = None
        self._started = False

    # ---- public API ------------------------------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.workdir / "etc" / "slurm.conf"

    @property
    def partition(self) -> str:
        return PARTITION

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.num_nodes + 1)]

    @property
    def node_addrs(self) -> dict[str, str]:
        """Node name -> its address on the cluster bridge."""
        subnet = self._require_subnet()
        return {name: f"{subnet}.{10 + i}" for i, name in enumerate(self.node_names, start=1)}

    @property
    def controller_addr(self) -> str:
        return f"{self._require_subnet()}.1"

    def env(self) -> dict[str, str]:
        """What a Slurm client process needs: SLURM_CONF, and PATH with the Slurm client dir."""
        path = os.environ.get("PATH", "")
        client = _which("sbatch")
        client_dir = str(Path(client).parent) if client else "/usr/bin"
        if client_dir not in path.split(os.pathsep):
            path = os.pathsep.join([client_dir, path]) if path else client_dir
        return {"SLURM_CONF": str(self.conf_path), "PATH": path}

    def run(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (SLURM_CONF is always set).

        Defaults: capture output as text, check=True, timeout=30 s; any keyword overrides them.
        """
        # Without SLURM_CONF a client falls back to DNS SRV look-ups that leave the machine.
        env = {**os.environ, **dict(kw.pop("env", None) or {}), **self.env()}
        options: dict[str, Any] = {"capture_output": True, "text": True, "check": True, "timeout": 30}
        options.update(kw)
        return subprocess.run(cmd, env=env, **options)

    @contextlib.contextmanager
    def reconfigured(
        self, settings: Mapping[str, str] | None = None, lines: Sequence[str] = ()
    ) -> Iterator[None]:
        """slurm.conf with ``settings`` (``{"MaxArraySize": "4"}``: a key's line replaced, or added) and extra
        ``lines`` (a partition) for a while: ``scontrol reconfigure`` now and again when it is restored."""
        original = self.conf_path.read_text()
        kept = [line for line in original.splitlines() if line.split("=", 1)[0] not in (settings or {})]
        changed = kept + [f"{key}={value}" for key, value in (settings or {}).items()] + list(lines)
        self._replace_conf("\n".join(changed) + "\n")
        try:
            self.run(["scontrol", "reconfigure"])
            yield
        finally:
            self._replace_conf(original)
            self.run(["scontrol", "reconfigure"], check=False)

    def _replace_conf(self, text: str) -> None:
        """slurm.conf replaced in one rename: a slurmd still re-reading it for the last ``scontrol
        reconfigure`` sees the old file or the new one, never a truncated one (it read an empty file once,
        exited "Unable to process configuration file", and its node stopped responding for the rest of the
        suite)."""
        tmp = self.conf_path.with_name(f".{self.conf_path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.conf_path)

    def start(self, timeout: float = 60) -> None:
        """Bring the cluster up; return once every node is idle (and sacct answers)."""
        if self._started:
            return
        if os.geteuid() != 0:
            raise SlurmClusterError("the Slurm test cluster needs root (network namespaces, bridge)")
        ensure_packages(self.accounting)
        deadline = time.monotonic() + timeout
        # Under a lock: a sweep by a concurrent start must not see our half-made namespaces.
        with open(LOCKFILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            clean_stale_state(self.workdir)
            self._subnet = _pick_subnet()
            self._register(owner_pid=os.getpid(), exclusive=True)
        self._started = True  # from here on stop() has something to undo
        try:
            self._prepare_workdir()
            self._write_configs()
            self._setup_network()
            self._start_munge()
            if self.accounting:
                self._start_mariadb(deadline)
                self._start_slurmdbd(deadline)
            self._start_slurmctld(deadline)
            for name in self.node_names:
                self._start_slurmd(name)
            self._wait_ready(deadline)
        except BaseException as exc:
            report = self._log_report()
            self.stop()
            if isinstance(exc, Exception):
                raise SlurmClusterError(f"{exc}\n{report}") from exc
            raise

    def stop(self) -> None:
        """Tear everything down (idempotent): jobs, stragglers, daemons, namespaces, links."""
        if (self._subnet is None and not self._load_state()) or not self._shared_names_are_ours():
            # Never started (no saved state), or the namespaces and bridge now belong to another
            # live cluster: only sweep processes marked with our own workdir.
            _kill_and_wait(_marked_pids(str(self.workdir)), grace=2.0)
            self._started = False
            return
        self._cancel_all_jobs()
        # Anything left in a node that is not its slurmd (orphaned steps, user daemons).
        for name in self.node_names:
            slurmd = _read_pid(self._run_dir / f"slurmd-{name}.pid")
            _kill_and_wait([p for p in _netns_pids(self._netns(name)) if p != slurmd], grace=2.0)
        for name in self.node_names:
            self._kill_pidfile(self._run_dir / f"slurmd-{name}.pid")
        self._kill_pidfile(self._run_dir / "slurmctld.pid")
        self._kill_pidfile(self._run_dir / "slurmdbd.pid")
        self._kill_pidfile(self._run_dir / "mysqld.pid", grace=15.0)
        self._kill_pidfile(self._sockets / "munged.pid")
        # Belt and braces: whatever still carries our marker (a daemon that died before writing
        # its pid file, a step slurmd spawned while dying), then whatever is still in a netns.
        _kill_and_wait(_marked_pids(str(self.workdir)), grace=2.0)
        for name in self.node_names:
            ns = self._netns(name)
            _kill_and_wait(_netns_pids(ns), grace=1.0)
            _sh(["ip", "netns", "del", ns], check=False)
            _sh(["ip", "link", "del", self._veth(name)], check=False)
        _sh(["ip", "link", "del", BRIDGE], check=False)
        reg = _read_registry()
        if reg is not None and reg.get("workdir") == str(self.workdir):
            REGISTRY.unlink(missing_ok=True)
        if self._sockdir is not None and self._sockdir != self._run_dir:
            shutil.rmtree(self._sockdir, ignore_errors=True)
        self._started = False

    def __enter__(self) -> SlurmTestCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @classmethod
    def from_workdir(cls, workdir: Path) -> SlurmTestCluster:
        """Re-attach to a cluster brought up earlier (by `up`) from its saved state."""
        data = json.loads((Path(workdir) / "cluster.json").read_text())
        cluster = cls(workdir, data["num_nodes"], data["cpus_per_node"], data["accounting"])
        cluster._load_state()
        cluster._started = True
        return cluster

    # ---- layout ----------------------------------------------------------------------------

    @property
    def _run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def _log_dir(self) -> Path:
        return self.workdir / "log"

    @property
    def _sockets(self) -> Path:
        """Where munge's and MariaDB's sockets live: workdir/run unless that path is too long."""
        if self._sockdir is None:
            longest = self._run_dir / "mysqld.sock"
            if len(str(longest)) <= MAX_SOCKET_PATH - 4:
                self._sockdir = self._run_dir
            else:
                # crc32, not hash(): the name must be the same in the process that runs `down`.
                self._sockdir = Path(f"/tmp/{PREFIX}sock-{zlib.crc32(str(self.workdir).encode()):08x}")
        return self._sockdir

    def _netns(self, name: str) -> str:
        return f"{PREFIX}{name}"

    def _veth(self, name: str) -> str:
        return f"{PREFIX}v{name.removeprefix('node')}"

    def _require_subnet(self) -> str:
        if self._subnet is None and not self._load_state():
            raise SlurmClusterError("the cluster has not been started (no subnet chosen yet)")
        assert self._subnet is not None
        return self._subnet

    def _save_state(self) -> None:
        state = {
            "num_nodes": self.num_nodes,
            "cpus_per_node": self.cpus_per_node,
            "accounting": self.accounting,
            "subnet": self._subnet,
            "sockdir": str(self._sockets),
        }
        (self.workdir / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")

    def _load_state(self) -> bool:
        try:
            state = json.loads((self.workdir / "cluster.json").read_text())
        except (OSError, ValueError):
            return False
        self._subnet = state["subnet"]
        self._sockdir = Path(state["sockdir"])
        return True

    def _register(self, owner_pid: int | None, exclusive: bool = False) -> None:
        entry = {
            "workdir": str(self.workdir),
            "owner_pid": owner_pid,
            "owner_start": _pid_starttime(owner_pid) if owner_pid is not None else None,
        }
        if not exclusive:
            REGISTRY.write_text(json.dumps(entry) + "\n")
            return
        # O_EXCL: of two sessions starting at once, exactly one gets the bridge and namespaces.
        try:
            fd = os.open(REGISTRY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            reg = _read_registry() or {}
            raise SlurmClusterError(
                f"another Slurm test cluster is starting or running (workdir {reg.get('workdir')})"
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(entry) + "\n")

    def _shared_names_are_ours(self) -> bool:
        """False when bridge/netns names belong to another live cluster (never tear those down)."""
        reg = _read_registry()
        return reg is None or reg.get("workdir") == str(self.workdir) or not _registry_owner_alive(reg)

    def detach(self) -> None:
        """Hand ownership to nobody: the cluster outlives this process until `down`."""
        self._register(owner_pid=None)

    def _prepare_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for sub in MANAGED_DIRS:
            # Fresh state every start: stale job state or a stale datadir only cause confusion.
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
            (self.workdir / sub).mkdir(parents=True)
        for name in self.node_names:
            # slurmd creates its spool dir late and logs an error for its socket dir meanwhile.
            (self.workdir / "spool" / name).mkdir()
        self._sockets.mkdir(parents=True, exist_ok=True)
        # munged warns when its socket directory is not traversable; jobs may run as any user.
        self._sockets.chmod(0o755)
        self._save_state()

    # ---- configuration ---------------------------------------------------------------------

    def _write_configs(self) -> None:
        etc, wd = self.workdir / "etc", self.workdir
        sock = self._sockets
        hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        hosts.append(f"{self.controller_addr} {CONTROLLER_NAME}")
        hosts += [f"{addr} {name}" for name, addr in self.node_addrs.items()]
        (etc / "hosts").write_text("\n".join(hosts) + "\n")
        # No DNS server listens there: a missed look-up fails at once instead of leaving the machine.
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

        mem_mb = _total_memory_mb()
        real_memory = max(256, min(4000, mem_mb // max(1, self.num_nodes)))
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={CONTROLLER_NAME}({self.controller_addr})",
            f"SlurmctldPort={SLURMCTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire=5: a requeued job is held until its credentials expire (120 s by default).
            f"AuthInfo=socket={sock / 'munge.sock'},cred_expire=5",
            f"StateSaveLocation={wd / 'state'}",
            f"SlurmdSpoolDir={wd / 'spool' / '%n'}",
            f"SlurmctldPidFile={wd / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={wd / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={wd / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={wd / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # The cgroup default fails here without a cgroup.conf ("freezer not mounted").
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            # The default linear select hands out whole nodes: no 2 tasks per node, no shared arrays.
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "JobRequeue=1",
            "ReturnToService=2",
            # Latency knobs: signal -> requeued task running in ~15 s instead of ~145 s.
            "SchedulerParameters=bf_interval=1,sched_interval=2",
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            # Nodes share this machine's cores and memory: trust the configured sizes.
            "SlurmdParameters=config_overrides",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",  # the default (/usr/bin/mail) is not installed: an error per start
        ]
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                # An address, not `ctl`: host-side clients (sacct) have no hosts entry for it.
                f"AccountingStorageHost={self.controller_addr}",
                f"AccountingStoragePort={SLURMDBD_PORT}",
                # Connections to slurmdbd take their munge socket from here, not from AuthInfo.
                f"AccountingStoragePass={sock / 'munge.sock'}",
            ]
        else:
            lines.append("AccountingStorageType=accounting_storage/none")
        for name, addr in self.node_addrs.items():
            lines.append(
                f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={self.cpus_per_node} "
                f"RealMemory={real_memory} State=UNKNOWN"
            )
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

        if self.accounting:
            dbd = self.workdir / "etc" / "slurmdbd.conf"
            dbd.write_text(
                "\n".join(
                    [
                        "AuthType=auth/munge",
                        f"AuthInfo=socket={sock / 'munge.sock'}",
                        f"DbdHost={CONTROLLER_NAME}",
                        f"DbdAddr={self.controller_addr}",
                        f"DbdPort={SLURMDBD_PORT}",
                        "SlurmUser=root",
                        f"PidFile={wd / 'run' / 'slurmdbd.pid'}",
                        f"LogFile={wd / 'log' / 'slurmdbd.log'}",
                        "DebugLevel=info",
                        "StorageType=accounting_storage/mysql",
                        "StorageHost=localhost",
                        "StorageUser=root",
                        "StorageLoc=hpct_acct",
                    ]
                )
                + "\n"
            )
            dbd.chmod(0o600)  # slurmdbd refuses a config others can read

    # ---- network ---------------------------------------------------------------------------

    def _setup_network(self) -> None:
        _sh(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _sh(["ip", "addr", "add", f"{self.controller_addr}/24", "dev", BRIDGE])
        _sh(["ip", "link", "set", BRIDGE, "up"])
        for name, addr in self.node_addrs.items():
            ns, veth, peer = self._netns(name), self._veth(name), f"{PREFIX}p{name.removeprefix('node')}"
            _sh(["ip", "netns", "add", ns])
            _sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
            _sh(["ip", "link", "set", veth, "master", BRIDGE, "up"])
            _sh(["ip", "link", "set", peer, "netns", ns])
            _sh(["ip", "-n", ns, "link", "set", peer, "name", "eth0"])
            _sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            _sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            _sh(["ip", "-n", ns, "route", "add", "default", "via", self.controller_addr])

    # ---- daemons ---------------------------------------------------------------------------

    def _daemon_env(self) -> dict[str, str]:
        env = {**os.environ, **self.env(), MARKER_ENV: str(self.workdir)}
        # slurmdbd's MariaDB client would use /run/mysqld/mysqld.sock (it reads no option files,
        # so $MYSQL_HOME/my.cnf does not help); libmariadb's env variable points it at ours.
        env["MYSQL_UNIX_PORT"] = str(self._sockets / "mysqld.sock")
        env["PATH"] = os.pathsep.join([env["PATH"], *SBIN_DIRS])
        return env

    def _launch(self, label: str, cmd: Sequence[str], timeout: float = 30) -> None:
        """Run a command that daemonizes; its own stdout/stderr go to log/launch-<label>.log."""
        log = self._log_dir / f"launch-{label}.log"
        with open(log, "ab") as out:
            # stdin/stdout away from us and a new session: a daemon must never hold our pipes
            # (`eval "$(... up)"` would hang) nor get our terminal's Ctrl-C.
            proc = subprocess.run(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                start_new_session=True,
                timeout=timeout,
                check=False,
            )
        if proc.returncode != 0:
            raise SlurmClusterError(f"starting {label} failed ({proc.returncode}): {_tail(log, 10)}")

    def _in_namespace(self, hostname: str, command: str, netns: str | None) -> list[str]:
        """Wrap `command` to run with its own hostname, hosts and resolv.conf (and netns)."""
        hosts, resolv = (shlex.quote(str(self.workdir / "etc" / f)) for f in ("hosts", "resolv.conf"))
        script = (
            f"hostname {hostname} && mount --bind {hosts} /etc/hosts && "
            f"mount --bind {resolv} /etc/resolv.conf && exec {command}"
        )
        # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails with
        # "No filesystem mounted on /sys/fs/cgroup".
        prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        return [*prefix, "unshare", "--uts", "--mount", "sh", "-c", script]

    def _start_munge(self) -> None:
        key = self.workdir / "munge" / "munge.key"
        self.workdir.joinpath("munge").chmod(0o700)
        _sh(["mungekey", "--create", f"--keyfile={key}"])
        sock = self._sockets
        # Our own munged on our own socket and key: no dependence on, or disturbance of, a
        # system munged. --force: it runs as root here (everything in the cluster does).
        self._launch(
            "munged",
            [
                "munged",
                "--force",
                f"--socket={sock / 'munge.sock'}",
                f"--key-file={key}",
                f"--pid-file={sock / 'munged.pid'}",
                f"--log-file={self._log_dir / 'munged.log'}",
                f"--seed-file={self.workdir / 'munge' / 'munged.seed'}",
            ],
        )

    def _start_mariadb(self, deadline: float) -> None:
        db, sock = self.workdir / "db", self._sockets / "mysqld.sock"
        log = self._log_dir / "mariadb-install.log"
        with open(log, "wb") as out:
            proc = subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={db}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                    *MARIADB_FAST,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                timeout=60,
                check=False,
            )
        if proc.returncode != 0:
            raise SlurmClusterError(f"mariadb-install-db failed ({proc.returncode}): {_tail(log, 15)}")
        # --no-defaults: nothing from /etc/mysql (port, socket, datadir) leaks in.
        # --skip-networking: slurmdbd talks to it over the socket only.
        self._launch(
            "mariadbd",
            [
                "setsid",
                "-f",
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={db}",
                f"--socket={sock}",
                f"--pid-file={self._run_dir / 'mysqld.pid'}",
                f"--log-error={self._log_dir / 'mariadb.err'}",
                "--skip-networking",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                *MARIADB_FAST,
            ],
        )
        self._wait_for(lambda: _unix_socket_accepts(sock), deadline, "MariaDB socket")

    def _start_slurmdbd(self, deadline: float) -> None:
        self._launch("slurmdbd", self._in_namespace(CONTROLLER_NAME, "slurmdbd", netns=None))
        addr = self.controller_addr
        self._wait_for(lambda: _tcp_accepts(addr, SLURMDBD_PORT), deadline, "slurmdbd port")

    def _start_slurmctld(self, deadline: float) -> None:
        cmd = f"slurmctld -f {shlex.quote(str(self.conf_path))}"
        self._launch("slurmctld", self._in_namespace(CONTROLLER_NAME, cmd, netns=None))
        addr = self.controller_addr
        self._wait_for(lambda: _tcp_accepts(addr, SLURMCTLD_PORT), deadline, "slurmctld port")

    def _start_slurmd(self, name: str) -> None:
        cmd = f"slurmd -f {shlex.quote(str(self.conf_path))}"
        self._launch(f"slurmd-{name}", self._in_namespace(name, cmd, netns=self._netns(name)))

    def _wait_ready(self, deadline: float) -> None:
        expected = {name: "idle" for name in self.node_names}

        def nodes_idle() -> bool:
            proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=10)
            seen = {}
            for line in proc.stdout.splitlines():
                name, _, state = line.partition(" ")
                seen[name] = state.strip()
            return proc.returncode == 0 and seen == expected

        self._wait_for(nodes_idle, deadline, f"nodes {', '.join(self.node_names)} idle in sinfo")
        if self.accounting:

            def registered_and_sacct_answers() -> bool:
                # slurmctld 22.05 adds its cluster to slurmdbd on first contact (saves the ~1 s of
                # a `sacctmgr add cluster`); add it ourselves only if that has not happened.
                show = ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]
                clusters = self.run(show, check=False, timeout=10).stdout.split()
                if CLUSTER_NAME not in clusters:
                    if time.monotonic() - t_ctld > 3.0:
                        self.run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], check=False)
                    return False
                return self.run(["sacct", "-n", "-X", "-a"], check=False, timeout=10).returncode == 0

            t_ctld = time.monotonic()
            self._wait_for(
                registered_and_sacct_answers, deadline, f"cluster {CLUSTER_NAME} in sacctmgr, sacct"
            )

    # ---- faults ----------------------------------------------------------------------------

    def lose_node(self, name: str) -> None:
        """Node ``name`` dies: its slurmd and every process in its namespace (the job's steps and ranks on it)
        are SIGKILLed at once, as a power cut would leave them; its ranks are unreachable from then on. The
        controller is told at once (``scontrol update State=DOWN``) what it would notice after SlurmdTimeout
        (300 s): a job running with --no-kill then loses the node and its tasks, and goes on."""
        pids = _netns_pids(self._netns(name))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _kill_and_wait(pids, grace=0.0)
        self.run(["scontrol", "update", f"NodeName={name}", "State=DOWN", "Reason=lost"], check=False)

    def revive_node(self, name: str, timeout: float = 30.0) -> None:
        """Node ``name`` comes back (a reboot): its slurmd again, registered with the controller."""
        self._start_slurmd(name)
        self.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], check=False)

        def responding() -> bool:
            proc = self.run(["sinfo", "-h", "-n", name, "-o", "%T"], check=False, timeout=10)
            return proc.returncode == 0 and bool(proc.stdout.strip()) and "*" not in proc.stdout

        self._wait_for(responding, time.monotonic() + timeout, f"{name} to register again")

    # ---- tear-down helpers -----------------------------------------------------------------

    def _cancel_all_jobs(self, timeout: float = 30.0) -> None:
        ctld = _read_pid(self._run_dir / "slurmctld.pid")
        if ctld is None or not _pid_alive(ctld):
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout=10)
            jobs = proc.stdout.split()
            if proc.returncode != 0 or not jobs:
                return
            self.run(["scancel", *jobs], check=False, timeout=10)
            time.sleep(0.3)

    def _kill_pidfile(self, path: Path, grace: float = 5.0) -> None:
        pid = _read_pid(path)
        # Only a process that carries our marker: a pid file can outlive its process.
        if pid is not None and _marker_of(pid) == str(self.workdir):
            _kill_and_wait([pid], grace=grace)

    # ---- waiting and reporting -------------------------------------------------------------

    @staticmethod
    def _left(deadline: float) -> float:
        return deadline - time.monotonic()

    def _wait_for(self, predicate: Callable[[], bool], deadline: float, what: str) -> None:
        while True:
            try:
                if predicate():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def _log_report(self) -> str:
        parts = []
        logs = sorted(self._log_dir.glob("*.log")) + sorted(self._log_dir.glob("*.err"))
        for log in logs:
            tail = _tail(log)
            if tail.strip():
                parts.append(f"--- {log} ---\n{tail}")
        return "\n".join(parts)


@contextlib.contextmanager
def environment_for_benchmarks(num_nodes: int = 2) -> Iterator[dict[str, str]]:
    """The environment of a usable cluster: the one SLURM_CONF names, or a fresh one started (and stopped)."""
    with cluster_for_benchmarks(num_nodes) as (_, env):
        yield env


@contextlib.contextmanager
def cluster_for_benchmarks(num_nodes: int = 2) -> Iterator[tuple[SlurmTestCluster, dict[str, str]]]:
    """A usable cluster and its environment, for a benchmark that also acts on the nodes (loses one): the
    cluster SLURM_CONF names (brought up by ``up``; ``SLURM_CONF`` is ``WORKDIR/etc/slurm.conf``), left
    running, or a fresh one started and stopped."""
    if "SLURM_CONF" in os.environ:
        workdir = Path(os.environ["SLURM_CONF"]).resolve().parents[1]
        yield SlurmTestCluster.from_workdir(workdir), dict(os.environ)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, SlurmTestCluster(Path(tmp), num_nodes=num_nodes) as cluster:
        cluster.start()
        yield cluster, {**os.environ, **cluster.env()}


def _total_memory_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 4000


def _tcp_accepts(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _unix_socket_accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(str(path)) == 0


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.slurm.cluster",
        description="A real multi-node Slurm test cluster on this machine.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start a cluster and print the `export SLURM_CONF=...` to use")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--cpus-per-node", type=int, default=2)
    up.add_argument("--no-accounting", action="store_true", help="no MariaDB/slurmdbd (no sacct)")
    up.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    up.add_argument("--timeout", type=float, default=120)
    down = sub.add_parser("down", help="tear down the cluster brought up in --workdir")
    down.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args = parser.parse_args(argv)

    if args.action == "up":
        cluster = SlurmTestCluster(args.workdir, args.nodes, args.cpus_per_node, not args.no_accounting)
        t0 = time.monotonic()
        try:
            cluster.start(timeout=args.timeout)
        except SlurmClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        cluster.detach()
        print(
            f"# {len(cluster.node_names)} nodes up in {time.monotonic() - t0:.1f} s; "
            f"stop with: python -m tests.slurm.cluster down --workdir {cluster.workdir}",
            file=sys.stderr,
        )
        # Only the export lines on stdout, so `eval "$(python -m tests.slurm.cluster up)"` works.
        for key, value in cluster.env().items():
            if key != "PATH" or value != os.environ.get("PATH"):
                print(f"export {key}={value}")
        return 0

    workdir = args.workdir.resolve()
    if not (workdir / "cluster.json").exists():
        print(f"no cluster state in {workdir}; nothing to stop", file=sys.stderr)
        return 0
    t0 = time.monotonic()
    SlurmTestCluster.from_workdir(workdir).stop()
    print(f"# cluster in {workdir} stopped in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
