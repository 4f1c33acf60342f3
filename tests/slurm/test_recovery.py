"""Recovery on the real test cluster beyond restarts: a crash loop ends after ``cluster.max_no_progress``
attempts with its cause in one line; the user's own bug (the same error at the same step) after two, its
frame named; a NaN loss is skipped (the state after the step bitwise the state
before it) while ``hpctrain save`` and ``hpctrain stop`` act on the running job (no requeue); and rolled back
in the other mode (through the sbatch template)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import torch

from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.slurm import commands
from tests.support import FAST, REPO, checkpoint_values, hpctrain
from tests.support.user_project import broken_project

from .test_preemption import last_step, submit, wait_until
from .test_submit import wait_final

TRAIN = [*FAST, "cluster=slurm_test", "cluster.exclude=node3", "trainer.log_every=1", "trainer.eval_every=0"]


def test_a_script_that_crashes_before_step_1_ends_after_max_no_progress(slurm_cluster, tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "crash.py").write_text("import a_module_that_is_not_installed  # noqa: F401\n")
    run = tmp_path / "run"
    result = hpctrain(
        "task=script",
        "task.path=crash.py",
        "cluster=slurm_test",
        "cluster.exclude=node3",
        "cluster.max_restarts=5",
        "cluster.max_no_progress=2",
        f"hydra.run.dir={run}",
        cwd=project,
        env={"PYTHONPATH": str(REPO)},  # this checkout's hpctrain, from the project's directory
    )
    assert result.returncode == 0, result.stderr
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert wait_final([job_id], timeout=240)[job_id].state == "FAILED"
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["restart", "stopped"], records
    status = hpctrain("status", str(run))
    crash = [line for line in status.stdout.splitlines() if "crash loop" in line]
    assert crash and "a_module_that_is_not_installed" in crash[0], status.stdout


def test_the_users_bug_ends_after_two_attempts_naming_its_frame(slurm_cluster, tmp_path: Path):
    """Issue 43 (a): a ``_target_`` model that raises the same ValueError at the same step on every
    attempt, under the default Slurm profile (restarts on): FAILED after two attempts, and status says it is
    the user's code, with the frame."""
    project = tmp_path / "project"
    run = tmp_path / "run"
    broken = broken_project(project)
    result = hpctrain(*broken, *TRAIN, "trainer.max_steps=6", f"hydra.run.dir={run}", cwd=project)
    assert result.returncode == 0, result.stderr
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert wait_final([job_id], timeout=240)[job_id].state == "FAILED"
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["restart", "stopped"], records
    status = hpctrain("status", str(run))
    # Its third forward: step 3, or step 2 where a step takes two passes (4 ranks' share of the batch).
    assert re.search(r"the same error at step [23] twice", status.stdout), status.stdout
    assert "in your code at " in status.stdout and "brokenmodel.py:14 in forward" in status.stdout, (
        status.stdout
    )


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k] for k, v in a.items()
    )


def test_nan_skipped_then_save_and_stop_on_a_running_job(slurm_cluster, tmp_path: Path):
    run = tmp_path / "run"
    job_id = submit(
        run,
        *TRAIN,
        "trainer.max_steps=100000",
        "trainer.ckpt_every=1",
        "trainer.keep_last=1000",
        "faults.nan_at=3:3",
        "cluster.max_restarts=1",
    )
    wait_until(lambda: last_step(run) >= 6, "training past the NaN step", timeout=240)
    assert same(checkpoint_values(run, 2), checkpoint_values(run, 3)) and not same(
        checkpoint_values(run, 3), checkpoint_values(run, 4)
    )
    saved = hpctrain("save", str(run))
    assert saved.returncode == 0 and "saved a checkpoint of step" in saved.stdout, saved.stderr
    stopped = hpctrain("stop", str(run))
    assert stopped.returncode == 0 and "and stopped" in stopped.stdout, stopped.stderr
    assert wait_final([job_id], timeout=120)[job_id].state == "COMPLETED"
    assert commands.job_fields(job_id).get("Restarts") == "0"  # no requeue
    step = int(stopped.stdout.split("of step ")[1].split(" ")[0])
    assert last_step(run) == step == layout.step_of(layout.committed(run / "checkpoints")[0])
    assert "stopped by the user" in hpctrain("status", str(run)).stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("nonfinite")] == [3]
    refused = hpctrain("save", str(run))
    assert refused.returncode != 0 and "not running" in refused.stderr


def test_nan_rolled_back_through_the_sbatch_template(slurm_cluster, tmp_path: Path):
    run = tmp_path / "run"
    job_id = submit(
        run,
        *TRAIN,
        "launcher=sbatch",
        "trainer.max_steps=6",
        "trainer.ckpt_every=2",
        "trainer.nonfinite=rollback",
        "faults.nan_at=2:3",
    )
    assert wait_final([job_id], timeout=240)[job_id].state == "COMPLETED"
    log = (run / "logs" / "rank0.log").read_text()
    assert "rolling back to the newest checkpoint" in log and log.count("Resumed from") == 1, log[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6], "every step logged once across the rollback"


def test_a_node_failing_its_health_check_is_excluded_then_and_by_the_next_run(slurm_cluster, tmp_path: Path):
    """Issue 43 (a): the node is excluded by the run whose health check it failed, and the project's next run
    leaves it out without any option (its node record, under a site profile of the user's own)."""
    project = tmp_path / "project"
    (project / "conf" / "cluster").mkdir(parents=True)
    profile = (REPO / "hpctrain" / "conf" / "cluster" / "slurm_test.yaml").read_text()
    # The user's copy of the test cluster's profile, as the docs advise; the record is on by default.
    (project / "conf" / "cluster" / "site.yaml").write_text(profile.replace("bad_node_file: null\n", ""))
    script = tmp_path / "check.sh"
    # The job's second node fails in the first start only (a node that is bad until it is left out).
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$SLURM_NODEID" = 1 ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then\n'
        '  echo "$(hostname): the scratch disk is full"; exit 1\n'
        "fi\n"
    )
    script.chmod(0o755)
    site = ["--config-dir", "conf", "cluster=site", *FAST, "trainer.max_steps=4"]
    run, after = tmp_path / "run", tmp_path / "after"
    first = hpctrain(*site, f"cluster.health_check={script}", f"hydra.run.dir={run}", cwd=project)
    assert first.returncode == 0, first.stderr
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    assert wait_final([job_id], timeout=240)[job_id].state == "COMPLETED"
    fault = RunDir(run).read_faults()[0]
    assert "health check" in fault["why"] and "the scratch disk is full" in fault["why"], fault
    hosts = {r["host"] for r in json.loads((run / "ranks.json").read_text())}
    assert fault["host"] not in hosts and len(hosts) == 2, (fault, hosts)
    assert fault["host"] in commands.job_fields(job_id).get("ExcNodeList", "")
    # The project's record holds the node, with its evidence; hpctrain nodes lists it.
    record = json.loads((project / ".hpctrain" / "bad_nodes.json").read_text())
    [evidence] = record["nodes"][fault["host"]]
    assert evidence["kind"] == "unhealthy" and "the scratch disk is full" in evidence["why"], evidence
    assert evidence["run"] == str(run) and evidence["job"] == job_id, evidence
    listed = hpctrain("nodes", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"{fault['host']}\s+left out\s+unhealthy", listed.stdout), listed.stdout
    # The next run of the project: no health check, no option, and the node is left out of its job.
    second = hpctrain(*site, f"hydra.run.dir={after}", cwd=project)
    assert second.returncode == 0, second.stderr
    assert f"leaving out {fault['host']}: unhealthy" in second.stderr, second.stderr
    next_job = json.loads((after / "job.json").read_text())["job_id"]
    try:
        assert commands.job_fields(next_job).get("ExcNodeList") == fault["host"]
    finally:
        commands.cancel([next_job])
    # Forgotten, the node is the project's again.
    forgot = hpctrain("nodes", "--forget", fault["host"], cwd=project)
    assert (
        forgot.returncode == 0
        and fault["host"] not in json.loads((project / ".hpctrain" / "bad_nodes.json").read_text())["nodes"]
    ), forgot.stderr


def test_a_crash_loop_through_requeues_ends_after_max_no_progress(slurm_cluster, tmp_path: Path):
    run = tmp_path / "run"
    # Rank 3 is killed at step 1 of every job start: no start ever trains a step.
    job_id = submit(
        run,
        *TRAIN,
        "trainer.max_steps=10",
        "faults.kill_at=3:1",
        "cluster.max_requeues=5",
        "cluster.max_no_progress=2",
        "cluster.dist_timeout_s=60",
        "cluster.max_restarts=0",  # the requeue path (a restart inside the job, Slurm's default, heals it)
    )
    assert wait_final([job_id], timeout=300)[job_id].state == "FAILED"
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["requeue", "stopped"], records
    assert commands.job_fields(job_id).get("Restarts") == "1"
    status = hpctrain("status", str(run))
    assert "crash loop: 2 attempts in a row without a new step" in status.stdout, status.stdout


def test_the_goodput_ledger_counts_a_held_jobs_queue_wait(slurm_cluster, tmp_path: Path):
    """Issue 43 (a): a job held in the queue for 8 s (scontrol hold, then release): goodput.json's queue
    wait is at least 6 s, from Slurm's accounting, and its buckets sum to the wall time within 1 %."""
    run = tmp_path / "run"
    one = ["cluster=slurm_test", "cluster.nodes=1", "cluster.tasks_per_node=1", "trainer.max_steps=20"]
    job_id = submit(run, *FAST, *one, "+cluster.additional.hold=true")
    time.sleep(8)
    assert commands.job_fields(job_id).get("JobState") == "PENDING"
    subprocess.run(["scontrol", "release", job_id], check=True, timeout=30)
    assert wait_final([job_id], timeout=240)[job_id].state == "COMPLETED"
    ledger = json.loads((run / "goodput.json").read_text())
    buckets = ledger["buckets_s"]
    assert ledger["accounting"] and buckets["queue wait"] >= 6, ledger
    assert abs(sum(buckets.values()) - ledger["wall_s"]) <= 0.01 * ledger["wall_s"], ledger
    assert buckets["productive steps"] > 0 and ledger["job_starts"] == 1, ledger
    status = hpctrain("status", str(run))
    assert re.search(
        r"^goodput +ETTR 0\.\d\d of \d+ s since submission \(queue wait \d+%", status.stdout, re.M
    ), status.stdout
