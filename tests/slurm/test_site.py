"""Issue 32 on the real test cluster: a sweep past the site's MaxArraySize is several arrays under one record,
packed sweep members resume exactly after a pre-emption, and the queue is in view (Slurm's estimated start
per partition, a pending job's reason and estimate, a partition list)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import torch

from hpctrain.rundir.records import read_job, read_sweep
from hpctrain.slurm.commands import JobState, job_states
from tests.support import hpctrain, metrics, model_and_optimizer

from .test_jobs import fields, jobs_cli, wait_for
from .test_submit import wait_final

TINY = [
    "cluster=slurm_test",
    "cluster.nodes=1",
    "cluster.tasks_per_node=1",
    "data.max_bytes=200000",
    "trainer.eval_batches=1",
    "logger=jsonl",
]


PENDING = JobState("", "PENDING", "", "", "")


def read_log(run: Path) -> str:
    return (run / "logs" / "rank0.log").read_text()


def squeue_ids(*job_ids: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--array", "--jobs", ",".join(job_ids), "--format", "%i"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def test_a_sweep_past_max_array_size_is_one_sweep_of_several_arrays(slurm_cluster, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    with slurm_cluster.reconfigured({"MaxArraySize": "4"}):
        # Held (sbatch --hold): nothing runs, what is under test is the submission and the commands on it.
        result = hpctrain(
            "-m",
            *TINY,
            "cluster.additional.hold=true",
            "trainer.seed=range(1,11)",
            f"hydra.sweep.dir={sweep}",
        )
        assert result.returncode == 0, result.stderr
        record = read_sweep(sweep)
        assert record is not None and len(record.members) == 10
        arrays = record.arrays
        assert len(arrays) == 3 and record.array_job_id == arrays[0], record
        expected = [f"{arrays[a]}_{i}" for a, n in enumerate((4, 4, 2)) for i in range(n)]
        assert [m.job_id for m in record.members] == expected
        assert sorted(squeue_ids(*arrays)) == sorted(expected)
        assert f"Submitted 3 job arrays {', '.join(arrays)} (MaxArraySize=4): 10 members" in result.stdout

        shown = jobs_cli("status", sweep)
        assert shown.returncode == 0, shown.stderr
        head = f"sweep {sweep}: 3 array jobs {', '.join(arrays)} on slurm_test, 10 members (10 PENDING)"
        assert shown.stdout.splitlines()[0] == head, shown.stdout
        assert all(job in shown.stdout for job in expected)
        # One member of the third array, by its job id, finds its run directory through Slurm.
        member = jobs_cli("status", expected[9])
        assert member.returncode == 0 and fields(member.stdout)["run"] == record.members[9].run_dir

        summary = jobs_cli("summary", sweep)
        assert summary.returncode == 0, summary.stderr
        assert len((sweep / "summary.csv").read_text().strip().splitlines()) == 11  # header + 10 members

        cancelled = jobs_cli("cancel", sweep)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.startswith(f"cancelled array jobs {', '.join(arrays)}: 10 members")
        wait_for("every member to leave the queue", lambda: not squeue_ids(*arrays), timeout=30)
        # Accounting records a cancellation a moment after the queue lets go of the job (slurmdbd is async).
        wait_for(
            "accounting to record every cancellation",
            lambda: jobs_cli("status", sweep).stdout.splitlines()[0].endswith("10 members (10 STOPPED)"),
            timeout=60,
        )


def test_the_queue_in_view(slurm_cluster, tmp_path: Path) -> None:
    partitions = [
        "PartitionName=busy Nodes=node[1-2] MaxTime=INFINITE State=UP",
        "PartitionName=spare Nodes=node3 MaxTime=INFINITE State=UP",
    ]
    with slurm_cluster.reconfigured(lines=partitions):
        blocker = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-p",
                "busy",
                "-N2",
                "--exclusive",
                "--time=3",
                "--output=/dev/null",
                "--wrap",
                "sleep 170",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        waiting = tmp_path / "waiting"
        try:
            wait_for("the blocker to hold busy", lambda: squeue_state(blocker) == "RUNNING", timeout=30)
            both = [*TINY, "cluster.partition='busy,spare'", "trainer.max_steps=3"]
            dry = hpctrain(*both, "dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}")
            assert dry.returncode == 0, dry.stderr
            for shown in (dry.stdout, jobs_cli("plan", *both).stdout):
                lines = [line for line in shown.splitlines() if line.startswith("queue: ")]
                assert len(lines) == 2, shown
                assert lines[0].startswith("queue: busy   starts 20") and " min (using " in lines[0], lines
                assert lines[1].startswith("queue: spare  starts now ("), lines

            run = hpctrain(*TINY, "cluster.partition=busy", "trainer.max_steps=3", f"hydra.run.dir={waiting}")
            assert run.returncode == 0, run.stderr

            def pending_with_estimate() -> bool:
                state = fields(jobs_cli("status", waiting).stdout)
                return state.get("state", "").startswith("PENDING (") and "starts" in state

            wait_for("status to show the reason and Slurm's estimate", pending_with_estimate, timeout=30)
            state = fields(jobs_cli("status", waiting).stdout)
            assert state["state"] in ("PENDING (Resources)", "PENDING (Priority)"), state
            assert state["starts"].startswith("20") and state["starts"].endswith("(Slurm's estimate)")

            # A list: Slurm starts it where it can soonest (spare, while busy is full).
            soonest = tmp_path / "soonest"
            run = hpctrain(*both, f"hydra.run.dir={soonest}")
            assert run.returncode == 0, run.stderr
            job = read_job(soonest)
            assert job is not None
            assert wait_final([job.job_id], timeout=120)[job.job_id].state == "COMPLETED"

            # Slurm's accounting takes the job's record a moment after the job ends (CI once read none yet).
            def partition() -> str:
                args = ["sacct", "-n", "-X", "-P", "-j", job.job_id, "-o", "Partition"]
                return slurm_cluster.run(args).stdout

            wait_for("the job's accounting record", lambda: partition().strip() != "", timeout=30)
            shown = partition()
            assert shown.split() == ["spare"], shown

            unknown = hpctrain(*TINY, "cluster.partition='busy,nope'", f"hydra.run.dir={tmp_path / 'x'}")
            assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
            assert unknown.stderr.startswith("hpctrain: cluster.partition=busy,nope: no partition nope")
            assert not (tmp_path / "x").exists()
        finally:
            subprocess.run(["scancel", blocker], check=False)
            if read_job(waiting) is not None:
                jobs_cli("cancel", waiting)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def last_step(run: Path) -> int:
    return metrics(run)[-1]["step"] if (run / "metrics.jsonl").is_file() and metrics(run) else 0


def test_a_preempted_pack_resumes_every_unfinished_member_exactly(slurm_cluster, tmp_path: Path) -> None:
    sweep = tmp_path / "packs"
    # keep_last changes nothing a step computes: pack 1's members are pack 0's, uninterrupted (dropout on:
    # exactness needs every RNG restored too).
    result = hpctrain(
        "-m",
        *TINY,
        "cluster.pack=3",
        "trainer.max_steps=30",
        "trainer.log_every=1",
        "trainer.ckpt_every=0",
        "trainer.eval_every=0",
        "model.dropout=0.1",
        "trainer.keep_last=2,3",
        "trainer.seed=1,2,3",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr
    record = read_sweep(sweep)
    assert record is not None and len(record.members) == 6
    jobs = list(dict.fromkeys(m.job_id for m in record.members))
    assert len(jobs) == 2 and [m.pack for m in record.members] == [0, 0, 0, 1, 1, 1]
    runs = [Path(m.run_dir) for m in record.members]
    assert "in 2 jobs of up to 3 (cluster.pack)" in result.stdout

    # Pre-empt pack 0 while its second member trains: the first is done, the third has not started.
    wait_for("pack 0's second member to train", lambda: last_step(runs[1]) >= 8, timeout=300, every=0.2)
    assert last_step(runs[0]) == 30 and not (runs[2] / "metrics.jsonl").exists()
    subprocess.run(["scancel", "--signal=USR2", jobs[0]], check=True)
    states = wait_final(jobs, timeout=400)
    assert {s.state for s in states.values()} == {"COMPLETED"}, states

    assert "Stopped by SIGUSR2" in (runs[1] / "logs" / "rank0.log").read_text()
    for ours, twin in zip(runs[:3], runs[3:], strict=True):
        assert [r["step"] for r in metrics(ours)] == list(range(1, 31)), f"{ours}: every step once"
        assert [r["loss"] for r in metrics(ours)] == [r["loss"] for r in metrics(twin)], ours
        a = model_and_optimizer(ours / "checkpoints" / "step_00000030")
        b = model_and_optimizer(twin / "checkpoints" / "step_00000030")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{ours} differs"

    shown = jobs_cli("status", sweep)
    assert shown.stdout.splitlines()[0].endswith("6 members (6 COMPLETED)"), shown.stdout
    summary = jobs_cli("summary", sweep)
    assert summary.returncode == 0 and summary.stdout.count("COMPLETED") == 6, summary.stdout
    requeued = slurm_cluster.run(["sacct", "-n", "-X", "-P", "--duplicates", "-j", jobs[0], "-o", "State"])
    assert len(requeued.stdout.split()) == 2, requeued.stdout  # the pack ran twice: requeued once


def test_eval_jobs_one_per_checkpoint_after_the_training_job(slurm_cluster, tmp_path: Path) -> None:
    """Issue 41, item 5: the evaluation jobs wait in the queue (their partition down) until the training job
    has ended, past the prunes of keep_last=1 that would have removed steps 10 and 20: each still finds its
    checkpoint, eval.jsonl has every line, and status names no missing evaluation."""
    run = tmp_path / "run"
    result = hpctrain(
        *TINY,
        "trainer.eval_job=slurm_test",
        "trainer.max_steps=30",
        "trainer.ckpt_every=10",
        "trainer.keep_last=1",
        "trainer.eval_every=10",
        "trainer.log_every=10",
        f"hydra.run.dir={run}",
    )
    assert result.returncode == 0, result.stderr
    job = read_job(run)
    assert job is not None and (run / "eval.sbatch").is_file()
    partition = f"PartitionName={slurm_cluster.partition}"
    started = lambda: job_states([job.job_id]).get(job.job_id, PENDING).state != "PENDING"  # noqa: E731
    wait_for("the training job to start", started, timeout=120, every=0.2)
    # A down partition queues new jobs without starting them; the running training job goes on.
    slurm_cluster.run(["scontrol", "update", partition, "State=DOWN"])
    try:
        assert wait_final([job.job_id], timeout=240)[job.job_id].state == "COMPLETED"
        held = {s.state for s in job_states(re.findall(r"Evaluation job (\d+)", read_log(run))).values()}
        assert held == {"PENDING"}, held  # every evaluation still waits: steps 10, 20 were due for pruning
    finally:
        slurm_cluster.run(["scontrol", "update", partition, "State=UP"])
    log = read_log(run)
    submitted = re.findall(r"Evaluation job (\d+) for step (\d+) \(after job (\S+)\)", log)
    assert sorted(int(step) for _, step, _ in submitted) == [10, 20, 30], log[-3000:]
    assert {after for _, _, after in submitted} == {job.job_id}
    evals = [e for e, _, _ in submitted]
    states = wait_final(evals, timeout=300)
    assert {s.state for s in states.values()} == {"COMPLETED"}, states
    records = sorted(
        (json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()), key=lambda r: r["step"]
    )
    assert [r["step"] for r in records] == [10, 20, 30] and {r["job_id"] for r in records} == set(evals)
    logged = {r["step"]: r["val_loss"] for r in metrics(run) if "val_loss" in r}
    for record in records:  # the run's own validation of that checkpoint, in a job of its own
        assert abs(record["val_loss"] - logged[record["step"]]) <= 1e-5, (record, logged)
    shown = fields(jobs_cli("status", run).stdout)
    assert shown["eval"].endswith("(step 30; 3 evaluations)"), shown
    assert "missing" not in shown, shown
