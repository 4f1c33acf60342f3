"""Checkpoints in an object store from a real Slurm job: the submitter's credentials reach the job through
sbatch's environment, a pre-empted job saves to the store, and its requeue resumes from it (moto's S3 server
on the controller's address, which the nodes' network namespaces reach)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import ObjectDir
from hpctrain.rundir.records import read_job
from tests.support import hpctrain, metrics
from tests.support import s3 as s3_server

from .test_preemption import STORM, last_step, signal_job, wait_until
from .test_submit import wait_final


def test_a_preempted_job_saves_to_the_store_and_its_requeue_resumes_from_it(slurm_cluster, tmp_path: Path):
    server = s3_server.start(host=slurm_cluster.controller_addr)
    try:
        server.bucket("ckpt")
        run = tmp_path / "run"
        with_store = ["cluster=slurm_test", "cluster.nodes=2", "checkpoint.path=s3://ckpt/slurm"]
        overrides = [
            *STORM,
            "trainer.max_steps=20",
            "trainer.ckpt_every=5",
            *with_store,
            f"hydra.run.dir={run}",
        ]
        # The store's credentials in the submitter's environment only: sbatch hands them to the job.
        submitted = hpctrain(*overrides, env=server.env())
        assert submitted.returncode == 0, submitted.stderr
        record = read_job(run)
        assert record is not None
        job_id = record.job_id
        wait_until(lambda: last_step(run) >= 7, "training past its first save")
        signal_job(job_id, "USR2")
        assert wait_final([job_id], timeout=240)[job_id].state == "COMPLETED"
        log = (run / "logs" / "rank0.log").read_text()
        assert "Resumed from s3://ckpt/slurm/step_" in log, log[-3000:]
        assert [r["step"] for r in metrics(run)] == list(range(1, 21))
        root = ObjectDir.at("s3://ckpt/slurm", server.options())
        assert layout.committed(root)[0].name == "step_00000020"
        assert not layout.committed(run / "checkpoints")  # the run's folder records where, holds none
    finally:
        server.stop()
