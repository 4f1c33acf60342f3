"""``launcher=sbatch`` on the real test cluster: the srun and torchrun templates, dry runs, quoting, failures.
(Rendering alone, golden files included: tests/unit/launch/test_sbatch.py.)

The jobs are submitted together by one module fixture (the cluster runs them side by side where nodes
allow), then each test waits for its own. Every job is tiny: 10 steps of the 2-layer GPT on 200 kB. The
submitit run that the sbatch template's is compared with is conftest.py's ``two_node_ddp``, which
test_submit.py looks at too.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from hpctrain.slurm.commands import job_fields, job_states, run
from tests.support import FAST, hpctrain, metrics

from .cluster import SlurmTestCluster
from .conftest import TWO_NODE_DDP, Submitted

# 2 nodes × 2 tasks on node1 + node2 (node3 excluded, so where the ranks run is known): conftest.py's
# two_node_ddp run, less its sbatch comment and --exclusive.
TWO_BY_TWO = ["cluster=slurm_test", "trainer.max_steps=10", "trainer.seed=7", "cluster.exclude=node3", *FAST]
ONE_NODE = ["cluster=slurm_test", "cluster.nodes=1", "trainer.max_steps=10", *FAST]


def _submit(run_dir: Path, *overrides: str) -> str:
    result = hpctrain(*overrides, f"hydra.run.dir={run_dir}", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((run_dir / "job.json").read_text())["job_id"]


def _wait_final(job_id: str, run_dir: Path, timeout: float = 120) -> str:
    """Poll squeue/sacct until the job is in a final state; return it."""
    deadline = time.monotonic() + timeout
    while True:
        state = job_states([job_id]).get(job_id)
        if state is not None and state.final:
            return state.state
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} not final after {timeout} s: {state}\n{_slurm_output(run_dir)}"
            )
        time.sleep(0.5)


def _slurm_output(run_dir: Path) -> str:
    """The last lines of whatever Slurm wrote for the run (for failure messages)."""
    files = sorted((run_dir / "slurm").rglob("*.out"))
    return "\n".join(f"--- {f}\n" + "\n".join(f.read_text().splitlines()[-30:]) for f in files)


def _final_loss(run_dir: Path) -> float:
    return [row for row in metrics(run_dir) if "loss" in row][-1]["loss"]


@pytest.fixture(scope="module")
def jobs(
    slurm_cluster: SlurmTestCluster, two_node_ddp: Submitted, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple]:
    """Submit every run of this module at once: name → (run dir, job id)."""
    root = tmp_path_factory.mktemp("sbatch")
    pwned = root / "pwned"
    runs = {
        "sbatch": [*TWO_BY_TWO, "launcher=sbatch"],
        # Rank 1 kills itself at step 4: torchrun's agent restarts both workers (cluster.max_restarts=1).
        "torchrun": [
            *ONE_NODE,
            "launcher=sbatch",
            "cluster.sbatch_template=torchrun",
            "cluster.max_restarts=1",
            "faults.kill_at=1:4",
            "trainer.ckpt_every=2",
        ],
        # Fails on rank 1 at step 3; also carries shell code in cluster.env that must not run.
        "failing": [
            *ONE_NODE,
            "launcher=sbatch",
            "faults.fail_at=1:3",
            f"+cluster.env.X='$(touch {pwned}_env)'",
        ],
    }
    submitted = {}
    for name, overrides in runs.items():
        run_dir = root / name
        submitted[name] = (run_dir, _submit(run_dir, *overrides))
    submitted["submitit"] = (two_node_ddp.run, two_node_ddp.job_id)
    submitted["pwned"] = (pwned, "")
    return submitted


def test_sbatch_and_submitit_train_alike(jobs: dict[str, tuple]) -> None:
    assert set(TWO_BY_TWO) <= set(TWO_NODE_DDP), "the two runs must train the same thing"
    sbatch_dir, sbatch_job = jobs["sbatch"]
    submitit_dir, submitit_job = jobs["submitit"]
    assert _wait_final(sbatch_job, sbatch_dir) == "COMPLETED", _slurm_output(sbatch_dir)
    assert _wait_final(submitit_job, submitit_dir) == "COMPLETED", _slurm_output(submitit_dir)

    record = json.loads((sbatch_dir / "job.json").read_text())
    assert record["launcher"] == "sbatch"
    assert record["slurm_output"] == str(sbatch_dir / "slurm" / "%j.out")
    assert (sbatch_dir / "slurm" / f"{sbatch_job}.out").is_file()
    assert (sbatch_dir / "code" / "hpctrain" / "worker.py").is_file()
    script = (sbatch_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    assert "\nexec srun " in script

    ranks = json.loads((sbatch_dir / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert sorted(r["host"] for r in ranks) == ["node1", "node1", "node2", "node2"]
    assert metrics(sbatch_dir)[-1]["step"] == 10
    # Same seed, same world size, same rank order: the same training, bit for bit.
    assert _final_loss(sbatch_dir) == _final_loss(submitit_dir)


def test_torchrun_template_completes_after_a_restart(jobs: dict[str, tuple]) -> None:
    run_dir, job_id = jobs["torchrun"]
    assert _wait_final(job_id, run_dir) == "COMPLETED", _slurm_output(run_dir)
    script = (run_dir / "job.sbatch").read_text()
    assert (
        "torch.distributed.run" in script and "--nproc-per-node=2" in script and "--max-restarts=1" in script
    )
    # Restarted by torchrun inside the job (no requeue), from the step-2 checkpoint, recorded.
    assert job_fields(job_id).get("Restarts") == "0"
    (record,) = RunDir(run_dir).read_answers()
    assert (record["action"], record["resume_step"]) == ("restart", 2) and "torchrun" in record["cause"], (
        record
    )
    assert "Resumed from" in (run_dir / "logs" / "rank0.log").read_text()
    ranks = json.loads((run_dir / "ranks.json").read_text())
    assert [r["local_rank"] for r in ranks] == [0, 1]
    assert len({r["host"] for r in ranks}) == 1
    assert metrics(run_dir)[-1]["step"] == 10


def test_failing_run_ends_failed_and_env_runs_nothing(jobs: dict[str, tuple]) -> None:
    run_dir, job_id = jobs["failing"]
    assert _wait_final(job_id, run_dir) == "FAILED", _slurm_output(run_dir)
    error = json.loads((run_dir / "logs" / "rank1.error.json").read_text())
    assert "injected failure at step 3" in error["message"]
    pwned = jobs["pwned"][0]
    assert not Path(f"{pwned}_env").exists()


def test_dry_run_prints_script_and_submits_nothing(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    name = f"hpctdry{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "dry"
    result = hpctrain(
        *TWO_BY_TWO, "launcher=sbatch", "dry_run=true", f"cluster.job_name={name}", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    assert "Dry run: nothing submitted." in printed
    assert f"#SBATCH --job-name={name}" in printed and "exec srun --kill-on-bad-exit=1" in printed
    assert not run_dir.exists(), "a dry run writes nothing"
    # Nothing of that name was ever queued (a name, not a job count: other jobs share the cluster).
    assert run(["squeue", "--noheader", "--name", name]).strip() == ""
    assert run(["sacct", "--noheader", "--allocations", "--name", name]).strip() == ""
