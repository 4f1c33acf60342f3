"""One state word per run, the same for a run here and a Slurm job: RUNNING, COMPLETED, FAILED, STOPPED,
PREEMPTED (and PENDING while Slurm queues a job). No torch import here.

A run here has no scheduler to ask: its directory says it. RUNNING while a process holds its lock, FAILED
when a rank recorded an error, COMPLETED when it reached ``trainer.max_steps`` (a script: when it ended
without an error), else STOPPED (Ctrl-C, a stop signal, a killed process). A Slurm job's state is Slurm's
word mapped onto the same five; Slurm's own word is kept beside it (``STOPPED (Slurm: CANCELLED)``), and a
job Slurm calls COMPLETED that did not reach ``max_steps`` is STOPPED.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.rundir import RunDir, RunLock
from hpctrain.rundir.runs import finished
from hpctrain.slurm.commands import JobState

# The five state words, named once (a table: one line, not one word to a line).
RUNNING, COMPLETED, FAILED, STOPPED, PREEMPTED, PENDING = (
    "RUNNING", "COMPLETED", "FAILED", "STOPPED", "PREEMPTED", "PENDING",
)  # fmt: skip
STATES = (RUNNING, COMPLETED, FAILED, STOPPED, PREEMPTED, PENDING)
# Slurm's job states onto the five words (a table, packed four to a line).
SLURM_WORDS = {
    "PENDING": PENDING, "CONFIGURING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING, "RESV_DEL_HOLD": PENDING, "RUNNING": RUNNING, "COMPLETING": RUNNING,
    "STAGE_OUT": RUNNING, "SIGNALING": RUNNING, "RESIZING": RUNNING, "SUSPENDED": STOPPED,
    "STOPPED": STOPPED, "COMPLETED": COMPLETED, "FAILED": FAILED, "NODE_FAIL": FAILED,
    "OUT_OF_MEMORY": FAILED, "BOOT_FAIL": FAILED, "CANCELLED": STOPPED, "TIMEOUT": STOPPED,
    "DEADLINE": STOPPED, "PREEMPTED": PREEMPTED,
}  # fmt: skip
EXIT_FAILED = 1


@dataclass(frozen=True)
class RunState:
    word: str  # one of STATES
    slurm: str | None = None  # Slurm's own word, for a Slurm job

    def __str__(self) -> str:
        return self.word if self.slurm in (None, self.word) else f"{self.word} (Slurm: {self.slurm})"

    @property
    def can_continue(self) -> bool:
        """Whether ``hpctrain resume`` has something to continue (the run ended before its end)."""
        return self.word in (STOPPED, PREEMPTED, FAILED)


def run_state(run_dir: Path | None, job: JobState | None = None) -> RunState:
    """The state of the run in ``run_dir`` (None: only its job is known), from Slurm's word for its job
    when it has one, else from the directory."""
    if job is not None:
        word = SLURM_WORDS.get(job.state, job.state)
        if word == COMPLETED and run_dir is not None and not finished(run_dir):
            word = STOPPED  # every task exited 0, but training did not reach its end
        return RunState(word, job.state)
    if run_dir is None:
        return RunState(STOPPED)
    run = RunDir(run_dir)
    if run.lock.is_file() and RunLock(run.path).is_held():
        return RunState(RUNNING)
    if run.error_files():
        return RunState(FAILED)
    return RunState(COMPLETED if finished(run_dir) else STOPPED)
