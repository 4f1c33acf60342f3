"""Rank 0's outputs: the console (a progress bar on a terminal, plain lines elsewhere), metrics.jsonl, W&B,
TensorBoard (the same numbers as metrics.jsonl, at the same steps).

metrics.jsonl holds one JSON object per logged step, and one per step the non-finite guard skipped
(``"nonfinite": true``). It is strict JSON: a number that is not finite (NaN, ±inf: a skipped step's loss or
gradient norm) is written as ``null``, never as Python's bare ``NaN``/``Infinity``, which JSON does not have
and strict parsers refuse (:func:`finite_or_null`). After a resume from step S, records past S (written
before a crash, and about to be produced again) are dropped first, so every step appears once.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import string
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from hpctrain.config.redact import redact_config
from hpctrain.config.schema import LoggerConfig
from hpctrain.observe.streams import ConsoleFile
from hpctrain.rundir import RunDir

log = logging.getLogger(__name__)


# ``log.info(..., extra=RANK_LOG_ONLY)``: a line for the rank's log, not the console (where another process
# says it already: the local launcher names the command that continues a stopped run).
RANK_LOG_ONLY = {"console": False}


class ConsoleLogHandler(logging.Handler):
    """Log records through the rich console, so that they print above a live progress bar. A console whose
    reader went away (``| tee`` and Ctrl-C) takes nothing with it: the rank's log has every line."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if console_lost(self.console) or not getattr(record, "console", True):
            return
        self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich's own answer, were a write ever to raise BrokenPipeError past :class:`ConsoleFile`, is
        ``SystemExit(1)`` after pointing *sys.stdout* (the rank's log) at /dev/null: a lost console must
        neither kill the rank nor silence its log. Quiet from now on; the rank trains on."""
        self.quiet = True
        if isinstance(self.file, ConsoleFile):
            self.file.lost = True


def open_console() -> Console | None:
    """Rank 0's console: the launcher's terminal or pipe (passed as a file descriptor), or None."""
    fd = os.environ.get("HPCTRAIN_CONSOLE_FD")
    if fd is None:
        return None
    return _Console(file=ConsoleFile.open(int(fd)), highlight=False)


def console_lost(console: Console | None) -> bool:
    """Whether ``console``'s reader went away (a pipe whose reader died, a terminal that hung up)."""
    return console is not None and (console.quiet or bool(getattr(console.file, "lost", False)))


class Observer:
    """Everything rank 0 shows or records about training progress."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, console: Console | None, run_config: dict[str, Any]):
        self.cfg = cfg
        self.run_dir = run_dir
        self.console = console
        self.run_config = run_config
        self.metrics = RunDir(run_dir).metrics_writer()
        self._progress: Progress | None = None
        self._last_loss: float | None = None
        self._task: Any = None
        self._wandb: Any = None
        self._tensorboard: Any = None
        self._val_loss: float | None = None
        self._last_step = 0  # the newest step logged (the goodput charts' step)

    def rewind(self, step: int) -> None:
        """Back to ``step`` in the same process (``trainer.nonfinite=rollback``): later records go."""
        self.metrics.keep_only(lambda r: r.get("step", 0) <= step)

    def start(self, start_step: int, total_steps: int, wandb_run_id: str | None) -> str | None:
        """Begin at ``start_step``; return the W&B run id to store in checkpoints (None without W&B)."""
        self.metrics.keep_only(lambda r: r.get("step", 0) <= start_step)
        if self.console is not None and self.cfg.progress_bar and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, info="")
            self._progress.start()
        if self.cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events past the resumed step (written before a crash) go, as in metrics.jsonl
            self._tensorboard = SummaryWriter(
                str(RunDir(self.run_dir).tensorboard), purge_step=start_step + 1, flush_secs=10
            )
            if start_step == 0:  # the run's config as hparams (HParams tab), once, in this run's own events
                _write_hparams(self._tensorboard, redact_config(self.run_config))
        if self.cfg.wandb and self.cfg.wandb_mode != "disabled":
            wandb_run_id = self._start_wandb(wandb_run_id)
        return wandb_run_id

    def _start_wandb(self, run_id: str | None) -> str:
        import wandb

        # W&B run ids: 8 characters of [a-z0-9], as its own generator makes (not a public API).
        run_id = run_id or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        self._wandb = wandb.init(
            project=self.cfg.wandb_project,
            entity=self.cfg.wandb_entity,
            mode=self.cfg.wandb_mode,
            dir=str(self.run_dir),
            id=run_id,
            resume="allow",  # the same run continues after a resume or requeue
            name=self.run_dir.name,
            tags=list(self.cfg.wandb_tags),
            config=redact_config(self.run_config),  # secret cluster.env values never reach W&B
        )
        log.info("W&B run %s (%s) in %s", run_id, self.cfg.wandb_mode, RunDir(self.run_dir).wandb)
        return run_id

    def advance(self, step: int, loss: float | None = None) -> None:
        if loss is not None:
            self._last_loss = loss
        loss = self._last_loss  # between logged steps the bar keeps the latest loss
        self._drop_lost_bar()
        if self._progress is not None:
            info = f"loss {loss:.4f}" if loss is not None else ""
            if self._val_loss is not None:
                info += f" val_loss {self._val_loss:.4f}"
            self._progress.update(self._task, completed=step, info=info.strip())

    def log(self, record: dict[str, Any]) -> None:
        record = {**record, "time": round(time.time(), 3)}
        self._last_step = int(record["step"])
        self.metrics.write(finite_or_null(record))
        # W&B and TensorBoard chart numbers; names (the straggler's host) stay in metrics.jsonl.
        numbers = {
            k: v
            for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
        }
        # A list of numbers (a mixture of experts' load per expert) charts as one series per entry.
        for key, value in record.items():
            if isinstance(value, list) and all(isinstance(x, (int, float)) for x in value):
                numbers.update({f"{key}/{i}": x for i, x in enumerate(value)})
        if record.get("val_loss") is not None:
            self._val_loss = float(record["val_loss"])
        if self._wandb is not None:
            try:
                self._wandb.log(numbers, step=record["step"])
            except Exception as err:  # whatever W&B raises, training goes on
                self._wandb_lost(err)
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(tensorboard_tag(key), value, record["step"])
        self._drop_lost_bar()
        if self._progress is None:
            log.info(format_record(record))
        else:
            self.advance(record["step"], record.get("loss"))

    def charts(self, numbers: dict[str, float]) -> None:
        """Numbers about the whole run (its goodput) for W&B's summary and TensorBoard, at its last step;
        not a step's record (metrics.jsonl has none of them)."""
        if self._wandb is not None:
            try:
                self._wandb.summary.update(numbers)
            except Exception as err:  # whatever W&B raises, the run ends as it would
                self._wandb_lost(err)
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(tensorboard_tag(key), value, self._last_step)

    def _drop_lost_bar(self) -> None:
        """The terminal went away: the bar stops, and the steps go on as lines in the rank's log."""
        if self._progress is not None and console_lost(self.console):
            self._progress.stop()
            self._progress = None
            log.info("The console went away: training goes on, its lines in this log")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self.metrics.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception as err:
                self._wandb_lost(err)

    def _wandb_lost(self, err: BaseException) -> None:
        """W&B's service process died: Slurm's pre-emption SIGTERM reaches every process of the job, and W&B's
        service exits on it while hpctrain saves. Training and its checkpoint must not die with a logger:
        W&B stops for this job, metrics.jsonl keeps every step, the next job resumes the same W&B run."""
        log.warning(
            "W&B stopped logging for this job (%s: %s; its service process is gone, e.g. killed by a "
            "pre-emption's SIGTERM): metrics.jsonl keeps every step, the next job continues W&B run %s",
            type(err).__name__,
            str(err).splitlines()[0] if str(err) else "",
            getattr(self._wandb, "id", "?"),
        )
        self._wandb = None


def finite_or_null(value: Any) -> Any:
    """``value`` as metrics.jsonl holds it: every float that is not finite (NaN, ±inf), in a record and in
    its lists, becomes None (JSON's ``null``: Python's json would write a bare ``NaN``, which is not JSON).
    The record's ``nonfinite: true`` says why a skipped step's loss is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def format_record(record: dict[str, Any]) -> str:
    parts = [f"step {record['step']}"]
    for key, fmt in (
        ("loss", "{:.4f}"),
        ("val_loss", "{:.4f}"),
        ("val_acc", "{:.3f}"),
        ("lr", "{:.2e}"),
        ("grad_norm", "{:.3f}"),
        ("step_time_s", "{:.3f}s"),
        ("tokens_per_s", "{:,.0f} tok/s"),
        ("samples_per_s", "{:,.1f} samples/s"),
        ("mfu", "{:.1%}"),
        ("peak_mem_gib", "{:.2f} GiB"),
    ):
        if record.get(key) is not None:
            value = fmt.format(record[key])
            parts.append(
                value if key in ("step_time_s", "tokens_per_s", "samples_per_s") else f"{key} {value}"
            )
    return " | ".join(parts)


# TensorBoard's tags, grouped (one section per group in its Scalars tab): metric → group/name.
TAG_GROUPS = {
    "loss": "loss/train", "val_loss": "loss/val", "val_acc": "accuracy/val", "lr": "optim/lr",
    "grad_norm": "optim/grad_norm", "step_time_s": "time/step_s", "data_wait_s": "time/data_wait_s",
    "mfu": "throughput/mfu", "peak_mem_gib": "memory/peak_gib",
}  # fmt: skip


def tensorboard_tag(key: str) -> str:
    """The grouped TensorBoard tag of a metrics.jsonl key (``loss`` → ``loss/train``; throughput under
    ``throughput/``, straggler facts under ``stragglers/``, a router's under ``moe/``)."""
    if key in TAG_GROUPS:
        return TAG_GROUPS[key]
    if key.endswith(("_per_s", "_per_device")):
        return f"throughput/{key}"
    if key.startswith("straggler_"):
        return f"stragglers/{key.removeprefix('straggler_')}"
    if key.startswith("moe_"):  # a mixture of experts' router: load per expert (moe_load/0, ...), drops, loss
        return f"moe/{key.removeprefix('moe_')}"
    return f"other/{key}"


def _write_hparams(writer: Any, config: Any) -> None:
    """The run's config, flattened (``optim.lr``, ``model.d_model``, ...), as TensorBoard hparams in the
    run's own event files (``add_hparams`` would open a separate run for them)."""
    from torch.utils.tensorboard.summary import hparams

    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, (bool, int, float, str)):
            flat[prefix[:-1]] = node
        elif node is not None:
            flat[prefix[:-1]] = str(node)

    walk(config if isinstance(config, dict) else {}, "")
    experiment, session_start, session_end = hparams(flat, {"loss/val": 0.0, "loss/train": 0.0})
    for summary in (experiment, session_start, session_end):
        writer.file_writer.add_summary(summary)
