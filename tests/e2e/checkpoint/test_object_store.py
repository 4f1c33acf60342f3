"""Checkpoints in an object store (``checkpoint.path=s3://…``), against a real S3 server on loopback (moto's,
with request signing enforced: tests/support/s3.py): a 2-rank FSDP run killed with SIGKILL mid-save resumes
from the newest committed step bitwise; a truncated, changed or crafted object is refused as a damaged file
is; a missing bucket, wrong credentials and a server that stops answering mid-save are one line each and
lose nothing."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.reader import CheckpointNotLoadable
from hpctrain.checkpoint.tiers import read_checkpoint
from hpctrain.resilience.attribution import STORE_TYPES
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import ObjectDir
from tests.support import FAST, REPO, flat_tensors, hpctrain, metrics, this_checkout_first, worker_pids
from tests.support import s3 as s3_server

# Dropout on: a resume must also restore every rank's RNG streams to be exact.
RUN = [
    *FAST,
    "cluster.nproc=2",
    "parallel=fsdp",
    "model.dropout=0.1",
    "trainer.max_steps=20",
    "trainer.log_every=1",
    "trainer.ckpt_every=5",
    "trainer.keep_last=3",
    "trainer.eval_every=0",
]


KILL_WINDOW = ["faults.save_delay_s=4"]


@pytest.fixture(scope="module")
def server() -> Iterator[s3_server.S3Server]:
    started = s3_server.start()
    started.bucket("ckpt")
    yield started
    started.stop()


def run_env(server: s3_server.S3Server, **changes: str) -> dict[str, str]:
    return {**server.env(), **changes}


def store(server: s3_server.S3Server, prefix: str) -> ObjectDir:
    return ObjectDir.at(f"s3://ckpt/{prefix}", server.options())


def steps_in(root: ObjectDir) -> list[int]:
    return [layout.step_of(c) for c in layout.committed(root)]


def state_of(checkpoint: ObjectDir) -> dict[str, torch.Tensor]:
    return flat_tensors(read_checkpoint(checkpoint)["model_optim"])


def test_killed_mid_save_it_resumes_from_the_newest_committed_step_bitwise(
    server: s3_server.S3Server, tmp_path: Path
) -> None:
    env = run_env(server)
    whole = hpctrain(*RUN, "checkpoint.path=s3://ckpt/whole", f"hydra.run.dir={tmp_path / 'whole'}", env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert steps_in(store(server, "whole")) == [20, 15, 10]
    # The run's own folder holds no checkpoint, only where they are.
    assert not layout.committed(tmp_path / "whole" / "checkpoints")
    assert (tmp_path / "whole" / "checkpoints" / "store.json").is_file()
    assert "AWS" not in (tmp_path / "whole" / "checkpoints" / "store.json").read_text()

    run = tmp_path / "killed"
    # Rank 0 waits 4 s between the ranks' writes and the commit: the job is killed in that window at step 10,
    # with every shard of step 10 in the store and no manifest.
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            *RUN,
            "checkpoint.path=s3://ckpt/killed",
            *KILL_WINDOW,
            f"hydra.run.dir={run}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": this_checkout_first(), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    target = store(server, "killed") / "step_00000010"
    deadline = time.monotonic() + 120
    while not all((target / n).is_file() for n in ("__0_0.distcp", "__1_0.distcp", ".metadata")):
        assert job.poll() is None and time.monotonic() < deadline, "the run ended before its save at step 10"
        time.sleep(0.1)
    for pid in worker_pids(run):
        os.kill(pid, signal.SIGKILL)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)
    assert steps_in(store(server, "killed")) == [5]  # step 10 was never committed: never a candidate
    assert target.is_dir() and not (target / layout.MANIFEST).exists()

    resumed = hpctrain(*RUN, "checkpoint.path=s3://ckpt/killed", f"hydra.run.dir={run}", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from s3://ckpt/killed/step_00000005 (step 5)" in resumed.stdout
    log = (run / "logs" / "rank0.log").read_text()
    assert "Removing step_00000010: a checkpoint that was never committed" in log
    assert steps_in(store(server, "killed")) == [20, 15, 10]
    ours, theirs = (
        state_of(store(server, "killed/step_00000020")),
        state_of(store(server, "whole/step_00000020")),
    )
    unequal = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert ours.keys() == theirs.keys() and not unequal, f"{len(unequal)} tensors differ, e.g. {unequal[:3]}"
    losses = {r["step"]: r["loss"] for r in metrics(tmp_path / "whole")}
    assert {r["step"]: r["loss"] for r in metrics(run) if r["step"] > 5} == {
        s: losses[s] for s in range(6, 21)
    }

    # What the run's other commands read finds the store: the status, the export.
    exported = hpctrain("export", str(run), "--to", str(tmp_path / "exported"), env=env)
    assert exported.returncode == 0, exported.stderr
    assert "Exported s3://ckpt/killed/step_00000020 (step 20" in exported.stdout


def test_a_truncated_changed_or_crafted_object_is_refused_as_a_damaged_file_is(
    server: s3_server.S3Server, tmp_path: Path
) -> None:
    env = run_env(server)
    short = [*RUN, "trainer.max_steps=10", "checkpoint.path=s3://ckpt/damaged"]
    assert hpctrain(*short, f"hydra.run.dir={tmp_path / 'run'}", env=env).returncode == 0
    root = store(server, "damaged")
    newest = root / "step_00000010"
    shard = newest / "__1_0.distcp"
    data = shard.read_bytes()

    shard.write_bytes(data[:-100])
    assert layout.problem_with(newest, checksums=False) == (
        f"__1_0.distcp has {len(data) - 100} bytes, the manifest says {len(data)}"
    )
    with pytest.raises(CheckpointNotLoadable, match=r"__1_0\.distcp has .* bytes, the manifest says"):
        read_checkpoint(newest)

    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0xFF
    shard.write_bytes(bytes(changed))
    # DCP carries the reader's error in its own (CheckpointException, a BaseException).
    with pytest.raises(BaseException, match=r"__1_0\.distcp does not match its checksum"):
        read_checkpoint(newest)

    # A resume skips the damaged step for the one before, with the reason, and goes on from there.
    resumed = hpctrain(*short, "trainer.max_steps=12", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert (
        "Skipping checkpoint s3://ckpt/damaged/step_00000010: CheckpointDamaged: __1_0.distcp does not match"
        in log
    )
    assert "Resumed from s3://ckpt/damaged/step_00000005 (step 5)" in resumed.stdout
    # Step 10 was not this run's to replace: moved aside whole (its manifest last), never overwritten.
    aside = [p for p in root.iterdir() if p.name.startswith("step_00000010.lineage-")]
    assert len(aside) == 1 and (aside[0] / layout.MANIFEST).is_file()

    # A crafted .metadata (a pickle that would run code) is refused by the allow-listed unpickler.
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch /tmp/hpctrain-pwned",))

    newest = layout.committed(root)[0]
    assert newest.name == "step_00000012"
    crafted = pickle.dumps(Boom())  # padded to the manifest's size: the size check alone would pass it
    (newest / ".metadata").write_bytes(crafted + bytes((newest / ".metadata").stat().st_size - len(crafted)))
    with pytest.raises(
        BaseException, match=r"\.metadata asks for posix\.system, which a checkpoint never holds"
    ):
        read_checkpoint(newest)
    assert not Path("/tmp/hpctrain-pwned").exists()


def test_a_missing_bucket_and_wrong_credentials_are_one_line_before_anything_starts(
    server: s3_server.S3Server, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    missing = hpctrain(
        *RUN, "checkpoint.path=s3://no-such-bucket/x", f"hydra.run.dir={run}", env=server.env()
    )
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "hpctrain: checkpoint.path=s3://no-such-bucket/x: no such bucket: The specified bucket does not "
        "exist (valid: a bucket that exists, credentials that may write it (the store's environment "
        "variables))"
    )
    wrong = hpctrain(
        *RUN,
        "checkpoint.path=s3://ckpt/x",
        f"hydra.run.dir={run}",
        env=run_env(server, AWS_SECRET_ACCESS_KEY="no"),
    )
    assert wrong.returncode == 2
    err = wrong.stderr.strip()
    assert "\n" not in err and err.startswith(
        "hpctrain: checkpoint.path=s3://ckpt/x: the store refused a write:"
    )
    assert not run.exists() or not list(run.iterdir())  # nothing started, nothing written


def test_a_store_that_stops_answering_mid_save_stops_the_run_in_one_line_and_loses_nothing(
    server: s3_server.S3Server, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    patience = (  # the client's own timeouts, short: a store that does not answer is found within seconds
        "+checkpoint.storage_options.config_kwargs="
        "{connect_timeout:2,read_timeout:3,retries:{max_attempts:1}}"
    )
    args = [
        *RUN,
        "trainer.max_steps=15",
        "checkpoint.path=s3://ckpt/stopped",
        patience,
        f"hydra.run.dir={run}",
    ]
    # 8 s between writing a step and committing it: the window in which this test, polling for step 5 on a
    # machine the suite saturates, stops the store before step 10 commits (3 s was missed once in CI).
    args += ["faults.save_delay_s=8", "checkpoint.store_timeout_s=5"]
    job = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": this_checkout_first(), **server.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (store(server, "stopped") / "step_00000005" / layout.MANIFEST).exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        os.kill(server.process.pid, signal.SIGSTOP)  # the store goes away while step 10 is saved
        try:
            _out, err = job.communicate(timeout=240)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    # The cause first, in one line (the store's client timed out saving step 10); a peer's lost
    # connection only after it, as its symptom.
    said = [line for line in err.splitlines() if line.startswith("hpctrain: ")]
    # Whichever rank met the stopped store first, in one line naming the store's error: hpctrain's bound on
    # a call (checkpoint.store_timeout_s=5) or the client's own timeout (3 s), whichever came first.
    assert said[0].startswith("hpctrain: rank "), err[-3000:]
    assert any(f"{name}: " in said[0] for name in STORE_TYPES), said[0]
    assert "Traceback" not in err
    # Nothing lost: step 5 is whole and the newest; the run's records are there, every step it trained up to
    # the call that met the stopped store (the prune after step 5's commit, or step 10's save, depending on
    # when the store stopped); it continues from step 5.
    assert steps_in(store(server, "stopped"))[0] == 5
    trained = [r["step"] for r in metrics(run)]
    assert trained == list(range(1, len(trained) + 1)) and len(trained) >= 5, trained
    resumed = hpctrain(*args[:-1], env=server.env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from s3://ckpt/stopped/step_00000005 (step 5)" in resumed.stdout


def test_saves_beside_training_go_through_the_writer_process_to_the_store(
    server: s3_server.S3Server, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = [*RUN, "trainer.max_steps=10", "trainer.async_checkpoint=true", "checkpoint.path=s3://ckpt/async"]
    done = hpctrain(*args, f"hydra.run.dir={run}", env=server.env())
    assert done.returncode == 0, done.stderr[-3000:]
    log = (run / "logs" / "rank0.log").read_text()
    assert "Committed step_00000005 (written" in log  # by the writer process, beside training
    assert steps_in(store(server, "async")) == [10, 5]
