"""``task=train`` (hpctrain.task.train) on one rank in this process: the trainer (hpctrain.train.trainer)
trains, logs every step, checkpoints, and a run that failed at a step resumes from its checkpoint to the
same losses and weights, bit for bit, dropout included. (The same on several ranks, through the CLI:
tests/e2e/checkpoint/test_resume.py.)"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hpctrain.config.compose import compose
from hpctrain.config.io import load_run_config, write_run_config
from hpctrain.launch.local import free_port
from hpctrain.rendezvous.env import DistEnv
from hpctrain.resilience.signals import StopSignals
from hpctrain.rundir import checkpoints as layout
from hpctrain.task.train import run_training
from tests.support import FAST, metrics, model_and_optimizer

RUN = [
    *FAST,
    "parallel=none",
    "cluster.nproc=1",
    "model.dropout=0.1",  # resume must restore the RNG streams too
    "trainer.max_steps=4",
    "trainer.ckpt_every=2",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "trainer.global_batch_size=8",
    "trainer.micro_batch_size=4",
    "logger.progress_bar=false",
]


def train(run_dir: Path, *overrides: str) -> None:
    """One rank of ``hpctrain RUN OVERRIDES`` in ``run_dir``, as hpctrain.worker runs it."""
    write_run_config(run_dir, compose([*RUN, *overrides, f"hydra.run.dir={run_dir}"]))
    env = DistEnv(0, 0, 1, 1, "127.0.0.1", free_port("127.0.0.1"), hostname="localhost")
    try:
        cfg = load_run_config(run_dir / "config.yaml")  # as the worker read it
        run_training(run_dir, env, None, StopSignals({"USR2", "TERM"}), cfg)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.usefixtures("as_a_worker")
def test_one_rank_trains_and_resumes_a_failed_run_bitwise(tmp_path: Path) -> None:
    whole, failed = tmp_path / "whole", tmp_path / "failed"
    train(whole)
    records = metrics(whole)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 and "grad_norm" in r for r in records)
    assert [p.name for p in layout.committed(whole / "checkpoints")] == ["step_00000004", "step_00000002"]

    with pytest.raises(RuntimeError, match="injected failure at step 3"):
        train(failed, "faults.fail_at=0:3")
    assert [p.name for p in layout.committed(failed / "checkpoints")] == ["step_00000002"]
    train(failed)  # trainer.resume=auto: from step 2
    resumed = metrics(failed)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert {r["step"]: r["loss"] for r in resumed} == {r["step"]: r["loss"] for r in records}
    a = model_and_optimizer(whole / "checkpoints" / "step_00000004")
    b = model_and_optimizer(failed / "checkpoints" / "step_00000004")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "Resumed from" in (failed / "logs" / "rank0.log").read_text()


OPENED: list[str] = []
WATCHED: list[str] = []  # the path whose opens are counted (none: the hook only returns)


def _count_opens(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and WATCHED and str(args[0]) == WATCHED[0]:
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.endswith("shutil.py"):
            frame = frame.f_back  # type: ignore[assignment]
        # A commit copies the file's bytes into its checkpoint (shutil): a copy, not a read of the config.
        OPENED.append("copied" if frame is not None else "read")


sys.addaudithook(_count_opens)  # for the process's life (a hook cannot be removed): idle unless WATCHED


@pytest.mark.usefixtures("as_a_worker")
def test_a_rank_reads_the_runs_config_once(tmp_path: Path) -> None:
    """config.yaml is read once per process: by the worker, then parsed again by none of the observer, the
    resume's checks and the progress line (a fresh run, then its resume from step 2, a longer schedule)."""
    run = tmp_path / "run"
    for overrides in (["faults.fail_at=0:3"], ["trainer.max_steps=5"]):
        write_run_config(run, compose([*RUN, *overrides, f"hydra.run.dir={run}"]))
        env = DistEnv(0, 0, 1, 1, "127.0.0.1", free_port("127.0.0.1"), hostname="localhost")
        OPENED.clear()
        WATCHED[:] = [str(run / "config.yaml")]
        try:
            cfg = load_run_config(run / "config.yaml")  # as the worker reads it
            with pytest.raises(RuntimeError) if overrides[0].startswith("faults") else _nothing():
                run_training(run, env, None, StopSignals({"USR2", "TERM"}), cfg)
        finally:
            WATCHED.clear()
            if dist.is_initialized():
                dist.destroy_process_group()
        assert OPENED.count("read") == 1 and "copied" in OPENED, OPENED
    assert "Resumed from" in (run / "logs" / "rank0.log").read_text()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield
