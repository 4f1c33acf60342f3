"""The trainer's one face of checkpointing: four calls, in the manner of torchtitan's ``checkpointer.save``
and Lightning's ``CheckpointIO`` (the loop says when a step ended; where, when and how it is written is
decided here).

    checkpointer = Checkpointer(cfg, env, run_dir, device)  # a node-local tier refused here, before a build
    checkpointer.plan_resume()  # the checkpoint a resume would continue (the model skips its random init)
    checkpointer.restore(resumable, optimizers, check, fresh)  # -> the checkpoint loaded, or None
    checkpointer.after_step(step, step_s, stopping)  # -> seconds its save took, or None: nothing was due
    checkpointer.close()

Behind it: the cadence (``trainer.ckpt_every``, ``auto``, ``checkpoint.local_every``:
:mod:`hpctrain.checkpoint.cadence`), the shared tier (DCP through the writer process, commit, prune and
lineage: :class:`~hpctrain.checkpoint.manager.CheckpointManager`) and the node-local tier (this job's copies
in node memory and on a peer: :class:`~hpctrain.checkpoint.fast.FastTier`). ``checkpoint.local_every``
reaches its write through this module and those, never through ``train/``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.cadence import Cadence
from hpctrain.checkpoint.fast import FastTier
from hpctrain.checkpoint.manager import CheckpointManager
from hpctrain.checkpoint.staging import state_bytes
from hpctrain.checkpoint.tiers import shared_tier
from hpctrain.config.schema import Config
from hpctrain.errors import ConfigError
from hpctrain.faults import NO_FAULTS, FaultInjector
from hpctrain.rendezvous.env import DistEnv
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as layout
from hpctrain.rundir.objects import Store, record_store

log = logging.getLogger(__name__)


def build_fast_tier(cfg: Config, env: DistEnv, run_dir: Path) -> FastTier | None:
    """This rank's fast tier (``checkpoint.local_every``), keyed by the run directory and this job."""
    c = cfg.checkpoint
    if c.local_every is None:
        return None
    job = layout.job_identity(os.environ)
    if job is None:
        raise ConfigError(
            "checkpoint.local_every",
            c.local_every,
            "needs a job: an srun task of a Slurm job, or a worker of hpctrain's local launcher (which sets "
            f"{layout.JOB_ID_ENV})",
            valid="null outside those",
        )
    paths = layout.FastTierPaths(Path(c.local_path), layout.run_key(run_dir), job)
    return FastTier(paths, env.hostname, env.rank, env.world_size, env.local_world_size)


class Checkpointer:
    """One rank's checkpointing for one start of the workers (collective: every rank makes the same calls
    at the same steps). ``entering(step, phase)``: told before a save (the hang watchdog's phase)."""

    def __init__(
        self,
        cfg: Config,
        env: DistEnv,
        run_dir: Path,
        device: torch.device,
        faults: FaultInjector = NO_FAULTS,
        entering: Callable[[int, str], None] | None = None,
    ) -> None:
        self.cfg, self.env, self.run_dir, self.faults = cfg, env, run_dir, faults
        self.entering = entering
        self.fast = build_fast_tier(cfg, env, run_dir)
        # Where the shared checkpoints are (checkpoint.path: an object store), and what the shared tier would
        # continue (a listing, once): model.init_from reads it too.
        c = cfg.checkpoint
        self.store = (
            Store(c.path, dict(c.storage_options), float(c.store_timeout_s)) if c.path is not None else None
        )
        checkpoints = RunDir(run_dir).checkpoints
        self.tier = shared_tier(checkpoints, self.store)
        self.shared_resume = layout.continued(cfg.trainer.resume, self.tier.root)
        self.cadence = Cadence(cfg, run_dir, device, local=self.fast is not None)
        self.manifest_info: dict[str, Any] = {}  # further facts for each manifest (e.g. lr_anchor)
        self._manager: CheckpointManager | None = None
        self._state: Mapping[str, Any] = {}
        self._on_commit: Callable[[int], None] | None = None
        self.load_s = 0.0  # seconds the resume took to load (hpctrain.observe.goodput's checkpoint load)

    def plan_resume(self) -> Path | None:
        """The checkpoint a resume would continue (``trainer.resume``: auto, never or a directory), without
        reading it: the shared tier's latest committed, else, on a restart inside this job, this rank's own
        fast-tier copy. None: a fresh start."""
        if self.shared_resume is None and self.cfg.trainer.resume == "auto" and self.fast is not None:
            return next(iter(layout.copies(self.fast.own)), None)
        return self.shared_resume

    def restore(
        self,
        state: Mapping[str, Any],
        optimizers: list[torch.optim.Optimizer],
        check: Callable[[Path], None] | None,
        fresh: bool,
    ) -> Path | None:
        """Take ``state`` (every Stateful of the checkpoint, by key) as what this checkpointer saves, start
        the writer where one is used, and load the checkpoint ``trainer.resume`` chooses into it: the one
        loaded, or None. ``fresh``: whether ``state`` is a fresh run's. None with :attr:`state_touched` set:
        the state is neither a checkpoint's nor a fresh one; the caller starts again from a fresh build."""
        t = self.cfg.trainer
        rd = RunDir(self.run_dir)
        self._state = state
        if self.store is not None and self.env.rank == 0:  # every reader of the run finds the store
            record_store(rd.checkpoints, self.store)
        manager = CheckpointManager(
            rd.checkpoints,
            t.keep_last,
            self.env.rank,
            rd.config,
            faults=self.faults,
            fast_tier=self.fast,
            on_writer_failure=self.cfg.checkpoint.on_writer_failure,
            store_host=self.env.master_addr,
            timeout_s=self.cfg.cluster.dist_timeout_s,
            tier=self.tier,
        )
        manager.manifest_info = self.manifest_info
        manager.on_commit = self._on_commit
        self._manager = manager
        manager.overlap_staging(optimizers)  # the loop changes weights only in optimizer.step()
        if self.fast is not None:  # refused in one line when the node-local path has no room for the state
            self.fast.prepare(state_bytes(state), "checkpoint.local_path")
        if t.async_checkpoint or self.fast is not None:
            # The writer process boots (an interpreter importing torch: ~1.5 s of CPU) beside the resume,
            # after the refusals above (a run refused starts no writer); started after the resume, its boot
            # slowed the first step after a restart from the fast tier from 1.2 to 2.8 s
            # (bench/fast_restart.py, 2026-11-27).
            manager.start_writer()
        began = time.perf_counter()
        found = manager.resume(state, t.resume, check=check, fresh=fresh)
        self.load_s += time.perf_counter() - began  # the goodput ledger's checkpoint load
        return found

    @property
    def state_touched(self) -> bool:
        """Nothing loaded into a state that is not a fresh one (see :meth:`restore`)."""
        return self._manager is not None and self._manager.state_touched

    @property
    def on_commit(self) -> Callable[[int], None] | None:
        """Called on rank 0 with the step of each checkpoint committed (``trainer.eval_job`` submits then)."""
        return self._on_commit

    @on_commit.setter
    def on_commit(self, call: Callable[[int], None] | None) -> None:
        self._on_commit = call
        if self._manager is not None:
            self._manager.on_commit = call

    @property
    def pending(self) -> bool:
        """A save is being written beside training."""
        return self._manager is not None and self._manager.pending

    def after_step(self, step: int, step_s: float, stopping: bool) -> float | None:
        """Step ``step`` ended after ``step_s`` seconds (``stopping``: a stop or a requested save follows):
        save it where the cadence says one is due, else commit a background write that finished. The
        seconds the save call took (the walltime guard plans with it), or None when nothing was due."""
        self.cadence.step_done(step_s, self.pending)
        shared, local = self.cadence.due(step, stopping)
        if not (shared or local):
            if self.pending:
                self._require().poll()  # committed now, not at the next save
            return None
        if self.entering is not None:
            self.entering(step, "checkpoint")
        t = self.cfg.trainer
        # Asynchronous under trainer.async_checkpoint, except the final save and the save on a stop.
        blocking = not t.async_checkpoint or step == t.max_steps or stopping
        start = time.perf_counter()
        self.save(step, blocking, shared=shared, local=local)
        took = time.perf_counter() - start
        self.cadence.saved(step, shared, step_s, took)
        return took

    def save(self, step: int, blocking: bool = True, shared: bool = True, local: bool = False) -> Path:
        """Save step ``step`` now (collective); ``blocking=False`` returns once the state is staged."""
        return self._require().save(step, self._state, blocking=blocking, shared=shared, local=local)

    def close(self, end_of_job: bool = True) -> None:
        """Finish any pending save and pruning, stop the writer; at the end of the job, remove this job's
        node-local copies on this node (collective)."""
        if self._manager is not None:
            self._manager.close(end_of_job=end_of_job)

    def _require(self) -> CheckpointManager:
        if self._manager is None:
            raise RuntimeError("Checkpointer.restore comes before a save")  # a caller's bug, not a user's
        return self._manager
