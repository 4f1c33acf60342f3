"""What a submission leaves behind so that ``hpctrain status | logs | cancel | summary`` can find it later.

<run dir>/job.json      one run: its Slurm job id, launcher, cluster, size, where Slurm writes output
<sweep dir>/sweep.json  a sweep: its array job id and one entry per member (overrides, run dir, job id)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

JOB_RECORD = "job.json"
SWEEP_RECORD = "sweep.json"


@dataclass
class JobRecord:
    job_id: str
    launcher: str  # submitit | sbatch
    cluster: str
    nodes: int
    tasks_per_node: int
    slurm_output: str  # where Slurm writes the tasks' stdout/stderr (a pattern with %j / %t for submitit)
    submitted_at: float = field(default_factory=time.time)


@dataclass
class SweepMember:
    index: int
    overrides: list[str]
    run_dir: str
    job_id: str


@dataclass
class SweepRecord:
    array_job_id: str
    cluster: str
    members: list[SweepMember]
    submitted_at: float = field(default_factory=time.time)


def write_json(path: Path, record: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=1))  # type: ignore[call-overload]
    tmp.replace(path)


def read_job(run_dir: Path) -> JobRecord | None:
    path = run_dir / JOB_RECORD
    return JobRecord(**json.loads(path.read_text())) if path.is_file() else None


def read_sweep(sweep_dir: Path) -> SweepRecord | None:
    path = sweep_dir / SWEEP_RECORD
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw["members"] = [SweepMember(**m) for m in raw["members"]]
    return SweepRecord(**raw)
