"""The trainer's face of checkpointing (hpctrain.checkpoint.service.Checkpointer), in one process: the loop
says a step ended and the checkpointer saves on its cadence; the next start plans and restores the newest
committed step; a node-local tier outside a job is refused before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint.service import Checkpointer
from hpctrain.checkpoint.state import RNGState, TrainState
from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import write_run_config
from hpctrain.errors import ConfigError
from hpctrain.rendezvous.env import DistEnv
from hpctrain.rundir import checkpoints as layout
from tests.support import FAST

CPU = torch.device("cpu")
ENV = DistEnv(0, 0, 1, 1, "127.0.0.1", 29500, hostname="localhost")


def _checkpointer(run_dir: Path, *overrides: str, phases: list | None = None) -> Checkpointer:
    run = [*FAST, "parallel=none", "trainer.max_steps=5", *overrides, f"hydra.run.dir={run_dir}"]
    composed = compose(run)
    write_run_config(run_dir, composed)
    entering = None if phases is None else (lambda step, phase: phases.append((step, phase)))
    return Checkpointer(to_typed(composed), ENV, run_dir, CPU, entering=entering)


def test_the_loop_says_a_step_ended_and_the_next_start_restores_the_newest(tmp_path: Path) -> None:
    phases: list[tuple[int, str]] = []
    checkpointer = _checkpointer(tmp_path, "trainer.ckpt_every=2", "trainer.keep_last=5", phases=phases)
    assert checkpointer.plan_resume() is None
    train = TrainState()
    assert checkpointer.restore({"train": train, "rng_rank0": RNGState()}, [], None, fresh=True) is None
    saved = []
    for step in range(1, 6):
        train.step = step
        if checkpointer.after_step(step, 0.01, stopping=False) is not None:
            saved.append(step)
    checkpointer.close()
    assert saved == [2, 4, 5]  # every ckpt_every steps and the last
    assert phases == [(2, "checkpoint"), (4, "checkpoint"), (5, "checkpoint")]
    assert [layout.step_of(c) for c in layout.committed(tmp_path / "checkpoints")] == [5, 4, 2]

    again = _checkpointer(tmp_path, "trainer.ckpt_every=2", "trainer.keep_last=5")
    newest = again.plan_resume()
    assert newest is not None and newest.name == "step_00000005"
    restored = TrainState()
    assert again.restore({"train": restored, "rng_rank0": RNGState()}, [], None, fresh=True) == newest
    assert restored.step == 5 and not again.state_touched
    assert again.after_step(6, 0.01, stopping=True) is not None  # a stop saves whatever the cadence
    again.close()


def test_a_save_before_restore_is_a_callers_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="restore comes before a save"):
        _checkpointer(tmp_path).save(1)


def test_a_node_local_tier_outside_a_job_is_refused_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_PROCID", "SLURM_JOB_ID", layout.JOB_ID_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=r"checkpoint\.local_every"):
        _checkpointer(tmp_path, "checkpoint.local_every=2")
    assert not (tmp_path / "checkpoints").exists()
