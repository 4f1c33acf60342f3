"""What a TARGET names (hpctrain.jobs.targets): a run directory, a sweep (recorded, or run here: numbered
member directories), a record file; what is none of these is one line. The states of a sweep run here come
from its directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.jobs.targets import LOCAL, JobsError, local_states, resolve
from hpctrain.rundir import JOB_RECORD, RunDir, RunLock
from hpctrain.rundir.records import JobRecord, write_error_record, write_json
from tests.support.runs import local_run, steps

FIVE = ["trainer.max_steps=5"]


def test_a_run_a_sweep_run_here_and_a_slurm_record_are_told_apart(tmp_path: Path) -> None:
    run = local_run(tmp_path / "run", FIVE, steps(5))
    target = resolve(str(run))
    assert (target.run_dir, target.job, target.is_sweep, target.slurm_id) == (run, None, False, None)
    sweep = tmp_path / "sweep"
    for i, lr in enumerate(("0.1", "0.2")):
        local_run(sweep / str(i), [*FIVE, f"optim.lr={lr}"], steps(5))
    found = resolve(str(sweep))
    assert found.is_sweep and found.sweep is not None and found.sweep.array_job_id == LOCAL
    assert [(m.index, m.overrides[-1], m.job_id) for m in found.sweep.members] == [
        (0, "optim.lr=0.1", f"{LOCAL}:0"),
        (1, "optim.lr=0.2", f"{LOCAL}:1"),
    ]
    job = JobRecord("123", "sbatch", "slurm_test", 2, 2, f"{run}/slurm/%j.out")
    write_json(RunDir(run).job, job)
    by_file = resolve(str(run / JOB_RECORD))  # a record file names its directory
    assert by_file.run_dir == run and by_file.job == job and by_file.slurm_id == "123"


def test_what_is_no_target_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobsError, match=r"empty: not a run or sweep directory \(no job.json, sweep.json or"):
        resolve(str(tmp_path / "empty"))
    with pytest.raises(JobsError, match="nowhere: no such run directory, sweep directory or Slurm job id"):
        resolve(str(tmp_path / "nowhere"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / JOB_RECORD).write_text('{"job_id": 1}')
    with pytest.raises(JobsError, match=r"bad: unreadable record"):
        resolve(str(tmp_path / "bad"))


def test_a_local_sweeps_states_come_from_its_directories(tmp_path: Path) -> None:
    done = local_run(tmp_path / "0", FIVE, steps(5))
    failed = local_run(tmp_path / "1", FIVE, steps(3))
    write_error_record(failed, 0, "RuntimeError", "boom")
    local_run(tmp_path / "2", FIVE, steps(2))
    running = local_run(tmp_path / "3", FIVE, steps(1))
    sweep = resolve(str(tmp_path)).sweep
    assert sweep is not None
    with RunLock(running).acquire():
        states = {k: s.state for k, s in local_states(sweep).items()}
    assert states == {"local:0": "COMPLETED", "local:1": "FAILED", "local:2": "STOPPED", "local:3": "RUNNING"}
    assert done.is_dir()
