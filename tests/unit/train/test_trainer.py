"""The trainer's pieces in one process (hpctrain.train.trainer), no process group: a run built from its
config starts from the seed's weights; one step over two passes (gradient accumulation) is the step of one
pass over the whole batch; evaluation is the mean loss over its fixed batches. (The loop itself, on one
rank: tests/unit/task/test_train.py.)"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hpctrain.config.compose import compose, to_typed
from hpctrain.config.io import write_run_config
from hpctrain.config.shape import run_shape
from hpctrain.data import shard_for_rank
from hpctrain.models import build_model
from hpctrain.rendezvous.env import DistEnv
from hpctrain.train.trainer import build_run, evaluate, loss_of, train_step
from tests.support import FAST

CPU = torch.device("cpu")
# One process's run, packed as a command line reads (a table of overrides).
RUN = [*FAST, "parallel=none", "cluster.nproc=1", "trainer.global_batch_size=8", "trainer.micro_batch_size=4",
       "trainer.eval_batches=2", "optim.grad_clip=0.5", "model.n_layers=2"]  # fmt: skip


def _run(tmp_path: Path):  # type: ignore[no-untyped-def]
    composed = compose([*RUN, f"hydra.run.dir={tmp_path}"])
    write_run_config(tmp_path, composed)
    cfg = to_typed(composed)
    env = DistEnv(0, 0, 1, 1, "127.0.0.1", 29500, hostname="localhost")
    return cfg, build_run(cfg, run_shape(cfg), env, CPU, tmp_path)


def test_two_passes_make_the_step_of_one_pass_over_the_whole_batch(tmp_path: Path) -> None:
    cfg, run = _run(tmp_path)
    torch.manual_seed(cfg.trainer.seed)
    initial = build_model(cfg.model).state_dict()
    assert all(torch.equal(initial[k], v) for k, v in run.par.model.state_dict().items())
    reference = copy.deepcopy(run.par.model)
    group = run.optimizer.param_groups[0]
    optimizer = torch.optim.AdamW(
        reference.parameters(), lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=0.0
    )
    for group in run.optimizer.param_groups:  # compare the update alone: no weight decay on either side
        group["weight_decay"] = 0.0
    indices = run.sampler.next_global_batch()
    run.sampler.load_state_dict({**run.sampler.state_dict(), "consumed": 0})
    passes = run.batches.next_step()
    assert len(passes) == 2  # 8 samples in passes of 4
    result = train_step(run.par, run.optimizer, run.scaler, passes, CPU, "fp32", 0.5, run.objective)
    x, y = run.train_set.get_batch(shard_for_rank(indices, 0, 1))
    loss = loss_of(reference(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    optimizer.step()
    torch.testing.assert_close(result.loss, loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.grad_norm, norm, rtol=1e-5, atol=1e-6)
    for (name, ours), theirs in zip(
        run.par.model.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    run.batches.close()


def test_evaluation_is_the_mean_loss_over_its_fixed_batches(tmp_path: Path) -> None:
    _, run = _run(tmp_path)
    expected = []
    for batch in range(2):  # eval_batches=2 global batches of 8, from the start of the val set
        x, y = run.val_set.get_batch([(batch * 8 + i) % len(run.val_set) for i in range(8)])
        with torch.no_grad():
            expected.append(F.cross_entropy(run.par.model(x).flatten(0, 1), y.flatten()))
    # Summed in float64 per pass of 4 by the trainer, per batch of 8 here: equal to float32's precision.
    assert evaluate(run)["val_loss"] == pytest.approx(torch.stack(expected).mean().item(), rel=1e-6)
    run.batches.close()
