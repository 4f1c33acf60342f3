"""``task=train`` (the default): hpctrain's trainer on one rank, with its answers to stops and faults.

The worker (:mod:`hpctrain.worker`) hands a rank here after taking the run directory's lock: this joins the
process group, opens the observers (rank 0), starts the hang watchdog, runs :func:`hpctrain.train.trainer.fit`
and, when Slurm's signal stopped it early, requeues the Slurm job (:mod:`hpctrain.resilience.requeue`). A
fault it only records and exits on: its supervisor answers (:mod:`hpctrain.launch.agent`)."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.observe.logs import setup_logging
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import load_yaml
from hpctrain.rundir.runs import continue_command

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.resilience.signals import StopSignals
    from hpctrain.resilience.watchdog import Heartbeat

log = logging.getLogger("hpctrain.worker")
# The evaluation jobs still being submitted when training ends (sbatch answers in ~0.1 s; a busy controller
# in seconds) finish before the process exits, at most this long.
EVAL_SUBMIT_WAIT_S = 60.0


def on_members(cfg: Config) -> Config:
    """``cfg`` on the nodes its restart agent gave this generation (a job that lost a node and continues on
    fewer, cluster.min_nodes: hpctrain.launch.nodes); ``cfg`` itself on all of its nodes."""
    from hpctrain.config.shape import run_shape
    from hpctrain.config.shrink import on_nodes
    from hpctrain.rendezvous.env import NODES_ENV

    members = [n for n in os.environ.get(NODES_ENV, "").split(",") if n]
    if not members or len(members) == cfg.cluster.nodes:
        return cfg
    fewer = on_nodes(cfg, len(members))
    shape = run_shape(fewer)
    log.warning(
        "Shrunk: on %d of cluster.nodes=%d nodes (%s): data-parallel size %d, the global batch of %d kept "
        "by %d passes a step",
        len(members),
        cfg.cluster.nodes,
        ",".join(members),
        shape.dp,
        shape.global_batch_size,
        shape.passes,
    )
    return fewer


def run_training(run_dir: Path, env: DistEnv, job_id: str | None, signals: StopSignals, cfg: Config) -> bool:
    """hpctrain's trainer on this rank: join the process group, train, and answer a stop or a fault.
    Whether training reached ``trainer.max_steps`` (False: stopped early, saved). ``cfg``: the run's
    config.yaml as the worker read it (once per process)."""
    import torch
    from omegaconf import OmegaConf

    from hpctrain.config.shape import run_shape
    from hpctrain.errors import CheckpointMismatch
    from hpctrain.observe import memory
    from hpctrain.observe.goodput import AttemptRecorder, write_ledger
    from hpctrain.observe.loggers import RANK_LOG_ONLY, ConsoleLogHandler, Observer, open_console
    from hpctrain.parallel.compile import open_compile_cache
    from hpctrain.precision import amp
    from hpctrain.rendezvous.group import init_distributed, record_topology
    from hpctrain.resilience import requeue
    from hpctrain.resilience.stop import USER_STOP, StopCheck
    from hpctrain.resilience.watchdog import Watchdog
    from hpctrain.slurm import commands
    from hpctrain.train.overrides import keep_global_batch
    from hpctrain.train.trainer import fit

    console = open_console() if env.is_main else None
    setup_logging(run_dir, env.rank, console_handler=ConsoleLogHandler(console) if console else None)
    cfg = on_members(cfg)
    signals.listen(cfg.cluster.signal)
    rendezvous_at = time.time()
    device = init_distributed(env, cfg.cluster.dist_timeout_s, RunDir(run_dir))
    joined = time.time()
    log.info("rank %d/%d on %s (%s), pid %d", env.rank, env.world_size, env.hostname, device, os.getpid())
    # What fills the GPU's memory, recorded before the model is built (trainer.memory_history).
    history = memory.wanted(cfg.trainer.memory_history, device.type == "cuda", run_dir)
    if history:
        memory.arm()
    elif cfg.trainer.memory_history and env.is_main:
        log.warning("trainer.memory_history=true: this run has no GPU (%s): nothing to record", device)
    record_topology(env, RunDir(run_dir))
    amp.set_matmul_precision(device, cfg.trainer.precision)
    end_time = commands.end_time(job_id) if job_id and env.is_main else None
    if end_time is not None and cfg.cluster.time_min is not None:
        # Backfill may have granted less than cluster.time: the walltime guard saves before this end.
        log.info(
            "Slurm ends this job at %s, in %d s (cluster.time=%s, cluster.time_min=%s): it saves before then",
            time.strftime("%H:%M:%S", time.localtime(end_time)),
            max(0, round(end_time - time.time())),
            cfg.cluster.time,
            cfg.cluster.time_min,
        )
    observer = None
    if env.is_main:
        plain = OmegaConf.to_container(load_yaml(RunDir(run_dir).config))
        observer = Observer(cfg.logger, run_dir, console, plain)  # type: ignore[arg-type]

    # The worker records what it saw and exits (at once: every second here is a second of the restart); its
    # supervisor (the local launcher, a Slurm task's agent, torchrun) answers: the fault policy decides.
    def on_hang(culprit: Heartbeat | None, why: str) -> None:
        requeue.record_fault(run_dir, job_id, culprit, why, "reported to its supervisor")

    t = cfg.trainer
    watchdog = Watchdog(run_dir, env.rank, env.hostname, t.watchdog_factor, t.watchdog_min_s, on_hang, joined)
    # Rank 0's timeline of this attempt: the goodput ledger's evidence (hpctrain.observe.goodput).
    raw_job = os.environ.get("SLURM_JOB_ID") if job_id else None
    attempt = AttemptRecorder(run_dir, watchdog.job, raw_job, rendezvous_at, joined) if env.is_main else None
    if attempt is not None:
        attempt.attach(watchdog)
    watchdog.flight_record = device.type == "cuda"  # NCCL's flight recorder is on (rendezvous.group)
    ended = False
    try:
        stop = StopCheck(signals, end_time, env.is_main, device, run_dir)
        cfg = keep_global_batch(cfg, run_dir)
        # Before anything compiles: a requeued job finds what an earlier start of it compiled.
        compile_cache = open_compile_cache(cfg, run_shape(cfg), device, run_dir, env.is_main)
        on_commit = EvalJobs(run_dir, job_id) if cfg.trainer.eval_job and job_id and env.is_main else None
        skip: frozenset[int] = frozenset()
        while True:  # trainer.nonfinite=rollback: again from the newest checkpoint, past the bad batches
            try:
                result = fit(
                    cfg, run_shape(cfg), env, device, run_dir, observer, stop, watchdog, on_commit, skip
                )
            except torch.OutOfMemoryError:
                if history:  # what filled the GPU, then the error as raised (the exit status is never 0)
                    memory.write_oom(run_dir, env.rank)
                raise
            if result.rollback is None:
                break
            skip = skip | {result.rollback}
        if on_commit is not None:
            on_commit.wait(EVAL_SUBMIT_WAIT_S)
        if compile_cache is not None:
            log.info("%s", compile_cache.summary())
        ended = True
    except CheckpointMismatch:
        # Refused: the run's record is again what it was before this submission (a Slurm job: kept for it by
        # the submitting command), else its config.yaml the one its checkpoints were trained with.
        if env.is_main and not RunDir(run_dir).restore_saved_record():
            RunDir(run_dir).restore_config()
        raise
    finally:
        watchdog.close()
        if attempt is not None:
            attempt.close()
            if ended:  # an attempt that ended by itself: where the run's time went, so far
                book = write_ledger(run_dir, log.info)
                if book is not None and observer is not None:
                    observer.charts({"goodput/ettr": book.ettr, "goodput/wall_h": book.wall / 3600})
        if observer is not None:
            observer.close()
    if result.stopped_by is None:
        return True
    if result.stopped_by == USER_STOP:  # hpctrain stop: saved, and ends without a requeue
        log.info("Stopped by the user after step %d (checkpoint saved)", result.state.step)
        # Asked for: the command (or the Slurm job) ends cleanly, exit 0 (Slurm must not requeue it); the
        # run directory records the stop (control.json), and status says STOPPED.
        return True
    if job_id is None:
        # The rank's log only: under the local launcher, the command's own last line names the way on, after
        # rank 0's one stop line (the trainer's "Stopped by ... after step N; checkpoint saved").
        log.info(
            "Stopped at step %d; continue with: %s",
            result.state.step,
            continue_command(run_dir),
            extra=RANK_LOG_ONLY,
        )
        return False
    requeue.requeue_or_fail(
        job_id, result.stopped_by, result.state.step, cfg.cluster.max_requeues, env.is_main, run_dir
    )
    return True  # requeued: Slurm runs the job again; its exit status stays what Slurm expects


class EvalJobs:
    """``trainer.eval_job``: after each committed checkpoint, submit the run's evaluation script
    (``eval.sbatch``, written at submission) as a job that depends on this one, from a background thread:
    the training loop never waits for sbatch. :meth:`wait` lets the last submissions finish before the
    process ends (the final checkpoint's comes just before it exits).

    Each submission pins its checkpoint (``eval_pins/``, :mod:`hpctrain.checkpoint.pins`) before sbatch runs,
    here on the committing thread, so that no later prune can remove it before its job has read it."""

    def __init__(self, run_dir: Path, job_id: str) -> None:
        self.run, self.job_id = RunDir(run_dir), job_id
        self.script = self.run.eval_script
        self.threads: list[threading.Thread] = []

    def __call__(self, step: int) -> None:
        self.run.write_eval_pin(step, None)
        thread = threading.Thread(target=self._submit, args=(step,), name=f"eval-job-{step}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _submit(self, step: int) -> None:
        from hpctrain.slurm import commands

        # This job's SLURM_*/SBATCH_* would be read by sbatch as options of the new job: left out.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update({k: v for k, v in os.environ.items() if k == "SLURM_CONF"})
        env[commands.EVAL_STEP_ENV] = str(step)
        try:
            outcome = commands.submit_dependent(self.script, self.job_id, env)
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # no sbatch here, or it timed out
            log.warning("trainer.eval_job: cannot submit the evaluation of step %d: %s", step, err)
            self.run.write_eval_pin(step, None, released=f"not submitted: {err}")  # status names it
            return
        if outcome.ok:
            evaluation = outcome.stdout.strip().split(";")[0]
            pin = self.run.read_eval_pins().get(step)
            if pin is None or pin.get("released") is None:  # not already read by a job that started at once
                self.run.write_eval_pin(step, evaluation)
            log.info("Evaluation job %s for step %d (after job %s)", evaluation, step, self.job_id)
        else:
            log.warning("trainer.eval_job: %s failed: %s", outcome.command, outcome.stderr.strip())
            why = f"not submitted: {outcome.stderr.strip() or f'sbatch exit {outcome.returncode}'}"
            self.run.write_eval_pin(step, None, released=why)
