"""Pure functions about Slurm's formats and environment: no subprocess, no torch, easy to test.

- time limits in every format sbatch accepts, to minutes;
- which strings may reach an ``#SBATCH`` line or a shell unquoted;
- node lists (``node[1-3,7],gpu-a01``) expanded to host names;
- the rendezvous port every task of a job derives alike;
- the counts Slurm puts in a job's environment, which a shell may also hold (malformed).
"""

from __future__ import annotations

import math
import re
import zlib

# Partition, account, qos, constraint, exclude, job name: what Slurm itself accepts in practice, and no
# character a shell would act on (no space, quote, $, `, ;, &, |, <, >, parentheses, backslash, newline).
SAFE_SLURM_TOKEN = re.compile(r"^[A-Za-z0-9_.,:@%+=\[\]\-]+$")
# Constraints may combine features with & and | inside an #SBATCH line (not a shell): allow those too.
SAFE_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@%+=\[\]\-&|*()]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# sbatch --mail-type values (sbatch(1)).
MAIL_TYPES = (
    "NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
    "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS",
)  # fmt: skip
MAIL_USER = re.compile(r"^[A-Za-z0-9_.+\-]+@[A-Za-z0-9_.\-]+$")
# --dependency: type[:job_id[:job_id...]] joined by , (all) or ? (any); job ids may carry +time or _task.
DEPENDENCY = re.compile(
    r"^(singleton|[a-z]+(:[0-9]+([_+][0-9]+)?)+)([,?](singleton|[a-z]+(:[0-9]+([_+][0-9]+)?)+))*$"
)
SBATCH_OPTION = re.compile(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$")
# Options hpctrain writes itself (each has a key of its own or is the job's machinery): not in additional.
RESERVED_SBATCH = (
    "job-name", "partition", "account", "qos", "time", "time-min", "nodes", "ntasks-per-node", "ntasks",
    "cpus-per-task", "gpus-per-node", "mem", "constraint", "exclude", "exclusive", "gres", "gpus-per-task",
    "reservation", "mail-user", "mail-type", "dependency", "signal", "requeue", "no-requeue", "output",
    "error", "array", "open-mode", "wrap", "chdir", "export",
)  # fmt: skip
# Container image references (docker://, registry/image:tag, squashfs paths) and mount specs src:dst[:flags].
SAFE_CONTAINER = re.compile(r"^[A-Za-z0-9_./:@+#\-]+$")
SAFE_MOUNT = re.compile(r"^[A-Za-z0-9_./\-]+:[A-Za-z0-9_./\-]+(:[a-z,]+)?$")

_TIME_FORMATS = [
    (re.compile(r"^(?P<m>\d+)$"), "MM"),
    (re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"), "MM:SS"),
    (re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"), "HH:MM:SS"),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"), "D-HH"),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"), "D-HH:MM"),
    (re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"), "D-HH:MM:SS"),
]
TIME_FORMATS_HELP = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_time_limit(text: str) -> int:
    """Minutes in a Slurm time limit (seconds round up, as Slurm does). ValueError if it does not parse."""
    text = text.strip()
    for pattern, _ in _TIME_FORMATS:
        match = pattern.fullmatch(text)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items()}
            seconds = (
                (parts.get("d", 0) * 24 + parts.get("h", 0)) * 60 + parts.get("m", 0)
            ) * 60 + parts.get("s", 0)
            if seconds <= 0:
                raise ValueError(f"time limit {text!r} is zero")
            return math.ceil(seconds / 60)
    raise ValueError(f"time limit {text!r} is not one of {TIME_FORMATS_HELP}")


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[1-3,07],gpu-a01`` → ``[node1, node2, node3, node07, gpu-a01]`` (zero padding kept)."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                hosts.extend(expand_nodelist(f"{prefix}{low}{suffix}"))
                continue
            width = len(low)
            for number in range(int(low), int(high) + 1):
                hosts.extend(expand_nodelist(f"{prefix}{number:0{width}d}{suffix}"))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if current:
        items.append(current)
    return [i for i in items if i]


def rendezvous_port(job_id: str, array_task: str = "", restart: str = "0", attempt: int = 0) -> int:
    """A port every task of a job start derives alike, over 20000–39999.

    A CRC-32 of (job id, array task, restart count, attempt): job ids that differ by 20000 no longer land on
    the same port (``id % 20000`` did), a requeued start moves off its predecessor's port (which may still
    be in TIME_WAIT), and ``attempt`` gives the next candidate when a port is taken.
    """
    key = f"{job_id}:{array_task}:{restart}:{attempt}".encode()
    return 20000 + zlib.crc32(key) % 20000


# What Slurm puts in a job's environment as counts, and hpctrain reads as integers (requeues, ranks, array
# task). Set by hand in a shell, or left over from an salloc, one that is not a count would fail every rank.
COUNT_VARIABLES = (
    "SLURM_RESTART_COUNT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_ARRAY_TASK_ID",
)


def malformed_count(environ: dict[str, str]) -> tuple[str, str] | None:
    """(name, value) of the first of COUNT_VARIABLES that is set but is no integer ≥ 0, else None."""
    for name in COUNT_VARIABLES:
        value = environ.get(name)
        if value is not None and not (value.isascii() and value.isdigit()):
            return name, value
    return None
