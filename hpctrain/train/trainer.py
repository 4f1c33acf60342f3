"""The training loop. Read ``fit`` top to bottom; ``train_step`` is one optimizer step.

Data order is defined in global samples (``GlobalBatchSampler``): each step takes the next
``global_batch_size`` samples of a seeded stream, each data-parallel rank takes its contiguous slice and
splits it into passes (a micro-batch; under pipeline parallelism, ``parallel.microbatches`` of them, which
the pipeline schedule interleaves). Ranks that differ only in their tensor-parallel or pipeline coordinate
take the same slice. Under DDP, gradients of all but the last pass stay local (``no_sync``).

Over 400 lines: the loop is kept in one file on purpose, to be read top to bottom (nanoGPT's rule); the
non-finite guard's policy is in :mod:`hpctrain.train.nonfinite`; what watches each step
(watchdog, profiler, stragglers, throughput, logging cadence) is grouped in :mod:`hpctrain.train.monitors`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hpctrain.checkpoint.service import Checkpointer
from hpctrain.checkpoint.state import ModelOptimizerState, RNGState, TrainState, seed_everything
from hpctrain.config.schema import Config
from hpctrain.config.shape import RunShape
from hpctrain.data import GlobalBatchSampler, build_datasets, split_micro_batches
from hpctrain.data.stream import BatchStream
from hpctrain.data.user import build_user_datasets
from hpctrain.faults import FaultInjector
from hpctrain.models import build_model
from hpctrain.models.adapters import add_lora
from hpctrain.models.builtin import model_spec
from hpctrain.models.moe import set_aux_loss_scale
from hpctrain.observe.loggers import Observer
from hpctrain.parallel.apply import Parallelized, parallelize, prime_ddp_buckets
from hpctrain.parallel.grad_norm import clip_grad_norm_
from hpctrain.precision import amp
from hpctrain.rendezvous.env import DistEnv
from hpctrain.resilience.stop import StopCheck
from hpctrain.resilience.watchdog import Watchdog
from hpctrain.rundir import RunDir
from hpctrain.train.loss import (
    Objective,
    build_objective,
    class_accuracy,
    cross_entropy,
    inputs_of,
    pipeline_pair,
    to_device,
)
from hpctrain.train.metrics import run_facts
from hpctrain.train.monitors import StepMonitors
from hpctrain.train.nonfinite import Guard, Rollback, agree_bad
from hpctrain.train.optim import build_optimizer, build_scheduler
from hpctrain.train.overrides import check_changes, config_changes, set_hyperparameters
from hpctrain.weights.load import init_from

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    loss: torch.Tensor  # this rank's mean loss over its micro-batches (not synchronised: no host sync)
    grad_norm: torch.Tensor  # global norm of the (unscaled) gradients before clipping
    skipped: bool = False  # not finite on some rank: no update applied (hpctrain.train.nonfinite)
    agreed: tuple[int, ...] | None = None  # the stop check's codes, agreed in the step's all-reduce


@dataclass
class FitResult:
    state: TrainState
    stopped_by: str | None  # why training stopped before max_steps (a checkpoint of that step is saved)
    rollback: int | None = None  # trainer.nonfinite=rollback: the bad step to skip after reloading


@dataclass
class Run:
    """Everything a training run holds, built once by :func:`build_run`."""

    cfg: Config
    shape: RunShape
    env: DistEnv
    device: torch.device
    par: Parallelized
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    train_set: Any
    val_set: Any
    sampler: GlobalBatchSampler
    batches: BatchStream  # this rank's batches, step by step, in the sampler's order
    objective: Objective  # how a batch goes through the model and the loss
    state: TrainState
    resumable: dict[str, Any]  # every Stateful of the checkpoint, by key
    checkpoints: Checkpointer
    faults: FaultInjector
    # (parameters of the whole model, of them those that train) where some are frozen (adapters), counted
    # before the model is split (a pipeline rank holds only its stages'); None where all train.
    trained: tuple[int, int] | None = None
    resumed: Path | None = None  # the checkpoint loaded
    built_fresh: bool = True  # built with the random init (False: for a checkpoint to overwrite)


def build_run(cfg: Config, shape: RunShape, env: DistEnv, device: torch.device, run_dir: Path) -> Run:
    """Model → parallelism → optimizer → data → checkpointer, then resume from the latest checkpoint.

    A checkpoint to continue overwrites every weight: the model is built without the random init it would
    overwrite (GPT-2 small's build 1.5 → 0.3 s of each restart). Should none load after all into the state
    built for it (or a damaged checkpoint left part of itself in it), the run starts once more, from a fresh
    build that loads nothing."""
    run = _build(cfg, shape, env, device, run_dir)
    if run.resumed is None and run.checkpoints.state_touched:
        log.warning(
            "No checkpoint loaded and the state is not a fresh one (%s): building it anew",
            "a damaged checkpoint left part of itself"
            if run.built_fresh
            else "built for a checkpoint to load",
        )
        run.checkpoints.close(end_of_job=False)
        fresh = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume="never"))
        run = _build(fresh, shape, env, device, run_dir)
    return run


def _build(cfg: Config, shape: RunShape, env: DistEnv, device: torch.device, run_dir: Path) -> Run:
    """One build of the run and its restore (:func:`build_run`)."""
    t = cfg.trainer
    # Same seed everywhere: every rank builds identical initial weights (DDP also broadcasts rank 0's), which
    # are those of a single-process run, whatever the layout.
    seed_everything(t.seed)
    # With adapters the base weights stay as init_from gave them: it is read on a resume too, and the
    # checkpoints hold only what trains (the adapters, their optimizer state).
    adapters = cfg.model.adapters != "none"
    base_from_init = adapters and cfg.model.init_from is not None
    faults = FaultInjector(cfg.faults, env.rank)
    checkpoints = Checkpointer(cfg, env, run_dir, device, faults)
    continued = checkpoints.plan_resume()
    random_init = base_from_init or continued is None
    model = build_model(cfg.model, random_init=random_init)
    if not random_init and env.rank == 0:
        log.info(
            "Built the model without its random init: the checkpoint %s overwrites every weight", continued
        )
    if cfg.model.init_from is not None:
        init_from(model, cfg.model, checkpoints.shared_resume, env.rank, base_from_init)
    if adapters:
        adapted = add_lora(model, cfg.model.lora)
        if env.rank == 0:
            log.info("LoRA adapters on %d module(s): %s", len(adapted), ", ".join(adapted[:4]))
    distinct = list({id(p): p for p in model.parameters()}.values())  # a tied weight once
    total, trains = sum(p.numel() for p in distinct), sum(p.numel() for p in distinct if p.requires_grad)
    # Some frozen (adapters, a user's PEFT model or frozen layers): what trains is said beside the whole.
    trained = (total, trains) if trains != total else None
    par = parallelize(model, cfg, device, shape)
    optimizer = build_optimizer(par.model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, t.max_steps)
    scaler = amp.grad_scaler(device, t.precision, sharded_grads=not par.whole_grads)
    if cfg.data.target is not None:
        train_set, val_set = build_user_datasets(cfg.data.target, cfg.data.args, cfg.data.collate)
    else:
        train_set, val_set = build_datasets(cfg.data, model_spec(cfg.model), t.seed)
    objective = build_objective(cfg.loss, cfg.data)
    first = to_device(train_set.get_batch([0]), device)
    prime_ddp_buckets(par.model, lambda model: objective(model, first)[1])
    sampler = GlobalBatchSampler(len(train_set), shape.global_batch_size, t.seed)
    dp_rank, dp_size = par.data_parallel
    batches = BatchStream(
        train_set,
        sampler,
        dp_rank,
        dp_size,
        shape.rank_samples_per_pass,
        cfg.data.num_workers,
        pin_memory=device.type == "cuda",
        seed=t.seed,
    )
    # Per-rank streams for dropout and the like, after the shared init.
    seed_everything(t.seed + 1 + env.rank)

    state = TrainState()
    resumable: dict[str, Any] = {
        "model_optim": ModelOptimizerState(
            par.model, optimizer, par.saved_names, trainable_only=base_from_init
        ),
        "scheduler": scheduler,
        "grad_scaler": scaler,
        "sampler": sampler,
        "train": state,
        f"rng_rank{env.rank}": RNGState(),
    }
    if cfg.parallel.compression != "none" and par.compression is not None:
        resumable[f"compression_rank{env.rank}"] = par.compression
    checkpoints.manifest_info["global_batch_size"] = shape.global_batch_size
    resumed = checkpoints.restore(
        resumable,
        [optimizer],
        check=lambda c: check_changes(c, config_changes(c, RunDir(run_dir).config)),
        fresh=random_init,
    )
    if resumed is not None:
        anchor = set_hyperparameters(optimizer, scheduler, cfg, resumed)
        if anchor is not None:  # the schedule changed on a resume: later resumes go on from the same anchor
            checkpoints.manifest_info["lr_anchor"] = list(anchor)
    # The cap is Slurm's own count (it also counts requeues no checkpoint saw); checkpoints record it.
    state.requeues = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    return Run(
        cfg,
        shape,
        env,
        device,
        par,
        optimizer,
        scheduler,
        scaler,
        train_set,
        val_set,
        sampler,
        batches,
        objective,
        state,
        resumable,
        checkpoints,
        faults,
        trained,
        resumed,
        random_init,
    )


def fit(
    cfg: Config,
    shape: RunShape,
    env: DistEnv,
    device: torch.device,
    run_dir: Path,
    observer: Observer | None,
    stop: StopCheck,
    watchdog: Watchdog,
    on_commit: Callable[[int], None] | None = None,
    skip_steps: frozenset[int] = frozenset(),
) -> FitResult:
    """Build the run, then train step by step until ``max_steps`` or a stop signal; save on the way.
    ``on_commit``: called on rank 0 with the step of each checkpoint committed (``trainer.eval_job``).
    ``skip_steps``: steps whose batches are consumed without an update (a rollback's bad steps)."""
    t = cfg.trainer
    guard = Guard(t.nonfinite, t.max_nonfinite_skips)
    run = build_run(cfg, shape, env, device, run_dir)
    state, checkpoints = run.state, run.checkpoints
    checkpoints.on_commit, checkpoints.entering = on_commit, watchdog.enter
    watchdog.resumed(state.step, checkpoints.load_s)
    if state.step >= t.max_steps:
        log.info("Already at step %d of %d: nothing to train", state.step, t.max_steps)
        return FitResult(state, None)
    monitors = _begin(run, observer, watchdog, run_dir, rollback=bool(skip_steps))
    save_s: float | None = None  # how long the last save took: the walltime guard plans with it
    stopped_by: str | None = None
    step_start = time.perf_counter()
    while state.step < t.max_steps:
        passes = monitors.next_batch(state.step + 1, run.batches.next_step)
        codes = stop.codes(monitors.step_s, save_s)  # sent in the step's own all-reduce
        result = _step(run, passes, state.step + 1, skip_steps, codes)
        lr = run.scheduler.get_last_lr()[0]
        back = _guarded(run, guard, result, state.step + 1, skip_steps, t.max_steps)
        if back is not None:
            checkpoints.close()
            run.batches.close()
            return FitResult(state, None, rollback=back)
        state.step += 1
        monitors.step_done(state.step, time.perf_counter() - step_start)
        record = monitors.record(state.step, result.loss, result.grad_norm, lr, skipped=result.skipped)
        _log(run, observer, record, state.step)
        stopped_by = (
            stop.decide(result.agreed) if result.agreed is not None else stop(monitors.step_s, save_s)
        )
        took = checkpoints.after_step(state.step, monitors.step_s, bool(stopped_by) or stop.save_requested)
        if took is not None:
            save_s = took
            if stop.save_requested and env.is_main:
                stop.answer(state.step)  # hpctrain save|stop: committed (a requested save is synchronous)
        if stopped_by:
            log.info("Stopped by %s after step %d; checkpoint saved (%.1f s)", stopped_by, state.step, save_s)
            break
        step_start = time.perf_counter()
    checkpoints.close()
    run.batches.close()
    return FitResult(state, stopped_by)


def _guarded(
    run: Run, guard: Guard, result: StepResult, step: int, skip_steps: frozenset[int], max_steps: int
) -> int | None:
    """The non-finite guard's answer to ``step``: the step to roll back to (the run stops here), else None. A
    step that updated moves the schedule on; a skipped one leaves it where it was."""
    if result.skipped and step not in skip_steps:
        try:
            guard.bad(step, float(result.loss), float(result.grad_norm), step == max_steps)
        except Rollback as back:
            return back.step
    elif not result.skipped:
        guard.good()
        run.scheduler.step()
    return None


def _begin(
    run: Run, observer: Observer | None, watchdog: Watchdog, run_dir: Path, rollback: bool
) -> StepMonitors:
    """Open the loggers (after a ``rollback``: rewind them to the checkpoint's step), say what trains, put
    every module in training mode; this rank's per-step monitors (hpctrain.train.monitors)."""
    cfg, env, state, t = run.cfg, run.env, run.state, run.cfg.trainer
    if not rollback:
        _start_observer(observer, state, env, t.max_steps)
    elif observer is not None:  # the loggers are open; metrics past the checkpoint go
        observer.rewind(state.step)
    facts = run_facts(model_spec(cfg.model), run.par.model, inputs_of(run.train_set.get_batch([0])))
    monitors = StepMonitors(
        cfg, run.shape, run.device, env.rank, env.hostname, run_dir, facts, watchdog, run.faults
    )
    monitors.router = run.par.router
    counted = f"{facts.n_params:,} parameters"
    if run.trained is not None:  # some frozen: what trains beside the whole
        which = "adapters; " if cfg.model.adapters != "none" else ""
        counted = f"{run.trained[0]:,} parameters, {run.trained[1]:,} trained ({which}the rest frozen)"
    log.info(
        "Training from step %d to %d: %s, %d rank(s) on %s, parallel=%s (%s)",
        state.step,
        t.max_steps,
        counted,
        env.world_size,
        run.device,
        cfg.parallel.name,
        run.shape.degrees,
    )
    run.par.model.train()  # every module, once: train_step re-enters training mode only after an evaluation
    return monitors


def _step(run: Run, passes: Any, step: int, skip_steps: frozenset[int], codes: list[int]) -> StepResult:
    """Step ``step``: one optimizer step over its passes; a batch that went bad before a rollback
    (``skip_steps``) is consumed, not trained. ``codes``: the stop check's, agreed in the step's own
    all-reduce."""
    if step in skip_steps:
        return StepResult(torch.tensor(float("nan")), torch.tensor(float("nan")), skipped=True)
    t = run.cfg.trainer
    return train_step(
        run.par,
        run.optimizer,
        run.scaler,
        passes,
        run.device,
        t.precision,
        run.cfg.optim.grad_clip,
        run.objective,
        judge_grads=t.precision != "fp16",
        poison=run.faults.nan_loss(step),
        codes=codes,
    )


def _start_observer(observer: Observer | None, state: TrainState, env: DistEnv, max_steps: int) -> None:
    """Open the loggers (rank 0) and share the W&B run id they chose with every rank's TrainState."""
    if observer is not None:
        state.wandb_run_id = observer.start(state.step, max_steps, state.wandb_run_id)
    if env.world_size > 1:
        state.wandb_run_id = _broadcast_object(state.wandb_run_id)


def _log(run: Run, observer: Observer | None, record: dict[str, Any] | None, step: int) -> None:
    """A due record, with the evaluation when due (a collective: every rank runs it), to the loggers."""
    if record is None:
        if observer is not None:
            observer.advance(step)
        return
    if record.pop("evaluate"):
        record.update(evaluate(run))
    if observer is not None:
        observer.log(record)


def train_step(
    par: Parallelized,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    passes: list[Any],
    device: torch.device,
    precision: str,
    grad_clip: float,
    objective: Objective | None = None,
    judge_grads: bool | None = None,
    poison: bool = False,
    codes: Sequence[int] = (),
) -> StepResult:
    """One optimizer step over this rank's passes (gradient accumulation when there are several).
    ``judge_grads``: the non-finite guard (None: off; True: loss and gradient norm; False: the loss only,
    under fp16 whose scaler judges the gradients); when any rank's are not finite, no update is applied.
    ``poison``: this rank's loss is NaN (``faults.nan_at``). ``codes``: more integers agreed (their maximum
    over the ranks) in the guard's all-reduce, returned in the result's ``agreed``."""
    model = par.model
    if not model.training:  # after an evaluation; train() visits every module (~0.2 ms for a 4-layer GPT)
        model.train()
    total_loss = torch.zeros((), device=device)
    # Each pass holds an equal share of the rank's samples: the mean of the passes' mean losses is the mean.
    # FSDP casts parameters itself (its mixed-precision policy); elsewhere autocast does (hpctrain.precision).
    autocast = amp.autocast(device, precision, par.regime)
    # A pipeline schedule runs forward and backward itself; each of its micro-batches' losses is divided by
    # the number of micro-batches of the whole step.
    pipeline_parts = (par.pipeline.n_microbatches if par.pipeline else 1) * len(passes)
    objective = objective or Objective()

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = objective.loss(logits, (None, target))
        return loss, scaler.scale(loss / pipeline_parts)

    if par.router is not None:  # a mixture of experts' auxiliary losses are back-propagated as the loss is
        set_aux_loss_scale(float(scaler.get_scale()) / (pipeline_parts if par.pipeline else len(passes)))
    for i, batch in enumerate(passes):
        batch = par.local_batch(to_device(batch, device), objective.target_key)
        if par.pipeline is not None:
            inputs, targets = pipeline_pair(batch, objective.target_key)
            with autocast:
                total_loss += par.pipeline.step(inputs, targets, loss_fn) / par.pipeline.n_microbatches
            continue
        with _no_sync_unless(model, i == len(passes) - 1), autocast:
            _, loss = objective(model, batch)
            if poison:
                loss = loss * float("nan")
            scaler.scale(loss / len(passes)).backward()
        total_loss += loss.detach()
    # Stages holding copies of one weight (a tied embedding and LM head) sum their gradients: Megatron's
    # embedding group (hpctrain.parallel.shared). Before unscaling and clipping, which then treat the copies
    # alike, so they stay equal.
    par.reduce_shared_grads()
    scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.requires_grad]
    if par.whole_grads:  # the local norm is the global one
        if grad_clip > 0:
            grad_norm = nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            grad_norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    else:
        grad_norm = clip_grad_norm_(params, grad_clip, par.dims.pp_group, par.uncounted)
    bad, agreed = (
        agree_bad(total_loss, grad_norm, judge_grads, codes) if judge_grads is not None else (False, None)
    )
    if bad:
        if scaler.is_enabled():
            scaler.update()  # its per-step record of this unscale_ is cleared; no optimizer step
        optimizer.zero_grad(set_to_none=True)
        return StepResult(total_loss / len(passes), grad_norm, skipped=True, agreed=agreed)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(total_loss / len(passes), grad_norm, agreed=agreed)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The default loss on a logits tensor and its targets (the planner's measurements use it)."""
    return cross_entropy(logits, (None, targets))


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Mean loss over ``eval_batches`` fixed global batches of the val set, weighted by samples (and the
    accuracy when the targets are one class label per sample). The loss is the run's own (``loss``)."""
    cfg, par, val_set, device = run.cfg, run.par, run.val_set, run.device
    t = cfg.trainer
    model = par.model
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss × samples, samples, correct, labels
    objective = run.objective
    batch_size = run.shape.global_batch_size
    dp_rank, _ = par.data_parallel
    per_rank = run.shape.rank_samples_per_step
    autocast = amp.autocast(device, t.precision, par.regime)
    for batch in range(t.eval_batches):
        start = (batch * batch_size + dp_rank * per_rank) % len(val_set)
        indices = (start + np.arange(per_rank)) % len(val_set)
        for chunk in split_micro_batches(indices, run.shape.rank_samples_per_pass):
            batch = par.local_batch(to_device(val_set.get_batch(chunk), device), objective.target_key)
            with autocast:
                if par.pipeline is None:
                    outputs = objective.outputs(model, batch)
                else:
                    outputs = par.pipeline.forward(pipeline_pair(batch, objective.target_key)[0])
            if outputs is None:  # a pipeline stage before the last
                continue
            sums[0] += objective.loss(outputs, batch).double() * len(chunk)
            sums[1] += len(chunk)
            accuracy = class_accuracy(outputs, batch, objective.target_key)
            if accuracy is not None:
                sums[2] += accuracy[0]
                sums[3] += accuracy[1]
    # Ranks that hold the same logits (tensor-parallel peers) add the same sums to numerator and denominator.
    if dist.is_initialized():
        dist.all_reduce(sums)
    out = {"val_loss": float(sums[0] / sums[1])}
    if sums[3] > 0:
        out["val_acc"] = float(sums[2] / sums[3])
    return out


def _no_sync_unless(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[None]:
    no_sync = getattr(model, "no_sync", None)
    return contextlib.nullcontext() if sync or no_sync is None else no_sync()


def _broadcast_object(value: object) -> object:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
