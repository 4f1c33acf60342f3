"""Submitting through submitit to the real test cluster: multi-node runs, sweeps as one array, snapshots,
and bad inputs that never reach Slurm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.rundir.records import read_job, read_sweep
from hpctrain.slurm.commands import JobState, job_states
from tests.support import REPO, hpctrain, metrics

from .conftest import TWO_NODE_DDP, Submitted

SMALL = [
    "cluster=slurm_test",
    "trainer.max_steps=10",
    "data.max_bytes=200000",
    "logger=jsonl",
    "trainer.eval_batches=1",
]


def wait_final(job_ids: list[str], timeout: float = 180) -> dict[str, JobState]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = job_states(job_ids)
        if all(j in states and states[j].final for j in job_ids):
            return states
        time.sleep(1)
    raise AssertionError(f"jobs did not finish in {timeout} s: {job_states(job_ids)}")


def queued_jobs() -> list[str]:
    out = subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_two_node_ddp_run(two_node_ddp: Submitted):
    """Also: sbatch options as people know them reach the job (cluster.additional, cluster.exclusive).
    The job (conftest.py) is shared with test_sbatch.py, which trains the same through the sbatch template."""
    run, result = two_node_ddp.run, two_node_ddp.result
    record = read_job(run)
    assert record is not None and record.nodes == 2 and record.tasks_per_node == 2
    assert f"Submitted Slurm job {record.job_id} (2 nodes × 2 tasks = 4 ranks" in result.stdout
    assert f"hpctrain status {run}" in result.stdout
    assert two_node_ddp.submit_s < 10, "submission must return once the job is queued, not wait for it"

    state = wait_final([record.job_id])[record.job_id]
    assert state.state == "COMPLETED", (state, (run / "logs" / "rank0.log").read_text()[-2000:])
    shown = subprocess.run(
        ["scontrol", "show", "job", record.job_id], capture_output=True, text=True, check=True
    ).stdout
    assert "Comment=hpctrain-test" in shown and "OverSubscribe=NO" in shown, shown
    ranks = json.loads((run / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    # Two ranks on each of the two nodes (cluster.exclude=node3 leaves Slurm node1 and node2).
    assert sorted(r["host"] for r in ranks) == ["node1", "node1", "node2", "node2"]
    assert metrics(run)[-1]["step"] == 10
    assert (run / "checkpoints" / "step_00000010").is_dir()


def test_sweep_is_one_job_array(slurm_sweep: Submitted):
    """The sweep (conftest.py, shared with test_report.py): 2 learning rates × a fault on or off."""
    sweep = slurm_sweep.run
    record = read_sweep(sweep)
    assert record is not None and len(record.members) == 4
    assert {m.job_id for m in record.members} == {f"{record.array_job_id}_{i}" for i in range(4)}
    assert f"Submitted job array {record.array_job_id}: 4 members" in slurm_sweep.result.stdout

    states = wait_final([m.job_id for m in record.members])
    failing = {m.job_id for m in record.members if "faults.fail_at='1:5'" in m.overrides}
    expected = {m.job_id: "FAILED" if m.job_id in failing else "COMPLETED" for m in record.members}
    assert {job: s.state for job, s in states.items()} == expected, states
    sacct = subprocess.run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--format=JobID",
            "--jobs",
            record.array_job_id,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    array_ids = {line.split("_")[0] for line in sacct.stdout.split()}
    assert array_ids == {record.array_job_id}, sacct.stdout
    combos = set()
    for member in record.members:
        (lr,) = [o for o in member.overrides if o.startswith("optim.lr=")]
        combos.add((lr, member.job_id in failing))
        if member.job_id not in failing:
            assert metrics(Path(member.run_dir))[-1]["step"] == 12
    assert combos == {(f"optim.lr={lr}", fails) for lr in ("0.001", "0.003") for fails in (False, True)}

    summary = subprocess.run(
        [sys.executable, "-m", "hpctrain", "summary", str(sweep)], capture_output=True, text=True, cwd=REPO
    )
    assert summary.returncode == 0, summary.stderr
    for member in record.members:
        assert member.job_id in summary.stdout or Path(member.run_dir).name in summary.stdout
    rows = (sweep / "summary.csv").read_text().strip().splitlines()
    assert len(rows) == 5  # header + 4 members


def _record(run: Path) -> dict[str, bytes]:
    """What status, resume and summary read of what trained a run: config.yaml and Hydra's record."""
    files = [run / "config.yaml", *sorted((run / ".hydra").glob("*"))]
    return {str(p.relative_to(run)): p.read_bytes() for p in files}


def test_a_job_whose_ranks_refuse_puts_the_runs_record_back(two_node_ddp: Submitted, tmp_path: Path):
    """Issue 41 on Slurm: the command has ended by the time the job's ranks refuse a checkpoint of another
    shape, so it keeps the run's record beside it (.record-before.json) and the job's rank 0 puts it back:
    config.yaml and .hydra/ are what trained the run, status says why the job failed, and ``hpctrain
    resume`` replays the run's own recipe, not the refused one."""
    assert wait_final([two_node_ddp.job_id])[two_node_ddp.job_id].state == "COMPLETED"
    run = tmp_path / "run"  # a copy: the session's run stays as test_sbatch.py compares it
    shutil.copytree(two_node_ddp.run, run, ignore=shutil.ignore_patterns(".lock"))
    before = _record(run)

    other = hpctrain(*TWO_NODE_DDP, "model.n_layers=3", "trainer.max_steps=20", f"hydra.run.dir={run}")
    assert other.returncode == 0, other.stderr[-3000:]  # submitted: the job decides
    kept = json.loads((run / ".record-before.json").read_text())
    assert kept["config.yaml"] == before["config.yaml"].decode()
    assert "model.n_layers=3" in (run / ".hydra" / "overrides.yaml").read_text(), "the job's own, meanwhile"
    record = read_job(run)
    assert record is not None and record.job_id != two_node_ddp.job_id
    state = wait_final([record.job_id])[record.job_id]
    assert state.state == "FAILED", (state, (run / "logs" / "rank0.log").read_text()[-2000:])

    assert _record(run) == before
    assert not (run / ".record-before.json").exists()
    status = hpctrain("status", str(run))
    assert "CheckpointMismatch" in status.stdout + status.stderr, status.stdout + status.stderr
    replay = hpctrain("resume", str(run), "dry_run=true")
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert "n_layers=3" not in replay.stdout + replay.stderr
    assert _record(run) == before, "a dry run writes no record"


def test_job_runs_the_code_as_submitted(slurm_cluster, tmp_path: Path):
    # A checkout of the package that the user submits from (their working directory, so it is what the
    # submitting `python -m` imports), then edits while the job waits. The job starts in that same directory:
    # the checkout must not shadow the snapshot there. Its trainer logs a marker at submit time that neither
    # the installed package nor the edited checkout has.
    tree = tmp_path / "src"
    shutil.copytree(REPO / "hpctrain", tree / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    trainer = tree / "hpctrain" / "train" / "trainer.py"
    trainer.write_text(trainer.read_text() + '\nlog.warning("code marker: as submitted")\n')
    # Occupy every node so the job stays queued while the tree changes.
    blocker = subprocess.run(
        ["sbatch", "--parsable", "-N3", "--exclusive", "--output=/dev/null", "--wrap", "sleep 60"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        _wait_running(blocker)
        run = tmp_path / "run"
        result = hpctrain(*SMALL, f"hydra.run.dir={run}", cwd=tree)
        assert result.returncode == 0, result.stderr
        record = read_job(run)
        assert record is not None
        assert job_states([record.job_id])[record.job_id].state == "PENDING"
        trainer.write_text(
            trainer.read_text().replace(
                'log.warning("code marker: as submitted")', 'raise RuntimeError("edited after submit")'
            )
        )
    finally:
        subprocess.run(["scancel", blocker], check=True)
    state = wait_final([record.job_id])[record.job_id]
    log = (run / "logs" / "rank0.log").read_text()
    assert state.state == "COMPLETED", log[-2000:]
    # Logged when the trainer module is imported, before the rank log exists: it is in Slurm's output.
    outputs = "".join(p.read_text() for p in (run / "slurm").rglob("*.out"))
    assert "code marker: as submitted" in outputs, "the job did not run the snapshot"
    assert "edited after submit" not in (run / "code" / "hpctrain" / "train" / "trainer.py").read_text()


def _wait_running(job_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while job_states([job_id])[job_id].state != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} did not start"
        time.sleep(0.5)


BAD_SUBMISSIONS = [
    (["cluster=nope"], "cluster=nope: unknown option"),
    (["cluster=slurm_test", "cluster.nodes=0"], "cluster.nodes=0: must be ≥ 1"),
    (["cluster=a100x32", "cluster.tasks_per_node=9"], "cluster.tasks_per_node=9: one task per GPU"),
    (["cluster=slurm_test", "cluster.job_name='x; touch /tmp/hpctrain-pwned'"], "cluster.job_name=x; touch"),
    (["cluster=slurm_test", "cluster.time=2h"], "cluster.time=2h: not a Slurm time limit"),
    (["cluster=slurm_test", "cluster.partition='debug$(id)'"], "cluster.partition=debug$(id)"),
    (["cluster=slurm_test", "cluster.container_mounts=['/a:/b;ls']"], "cluster.container_mounts=/a:/b;ls"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_SUBMISSIONS, ids=[m for _, m in BAD_SUBMISSIONS])
def test_bad_input_submits_nothing(slurm_cluster, tmp_path: Path, overrides: list[str], message: str):
    before = queued_jobs()
    run = tmp_path / "run"
    result = hpctrain(*overrides, f"hydra.run.dir={run}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpctrain: {message}"), result.stderr
    assert queued_jobs() == before
    assert not run.exists()
    assert not Path("/tmp/hpctrain-pwned").exists()


def test_dry_run_prints_the_plan_and_submits_nothing(slurm_cluster, tmp_path: Path):
    before = queued_jobs()
    result = hpctrain(*SMALL, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    assert "Dry run: nothing submitted." in result.stdout
    assert "2 nodes × 2 tasks = 4 ranks" in result.stdout and '"ntasks_per_node": 2' in result.stdout
    assert queued_jobs() == before
    assert read_job(tmp_path / "run") is None


def test_submit_path_does_not_import_torch(slurm_cluster, tmp_path: Path):
    code = (
        "import sys; from hpctrain.cli import main; main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch imported on the submit path'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *SMALL, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    record = read_job(tmp_path / "run")
    assert record is not None
    subprocess.run(["scancel", record.job_id], check=True)


def test_optuna_sweeper_gets_the_objective_from_the_array(slurm_cluster, tmp_path: Path):
    # A sweeper that chooses trials from results: the launcher waits for its batch and returns final losses.
    sweep = tmp_path / "optuna"
    result = hpctrain(
        "-m",
        *SMALL,
        "cluster.nodes=1",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2",
        "optim.lr=interval(0.0001,0.01)",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr
    record = read_sweep(sweep)
    assert record is not None and len(record.members) == 2
    finals = [metrics(Path(m.run_dir))[-1] for m in record.members]
    best = min(r["val_loss"] for r in finals)
    assert f"Best value: {best}" in result.stdout
