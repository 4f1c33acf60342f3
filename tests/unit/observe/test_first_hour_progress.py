"""Issue 29, item 10: a short run logs enough points for a curve (``trainer.log_every`` unset: 25, or 10
points over a shorter run), and the progress bar keeps the latest loss between logged steps."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from hpctrain.config.schema import LoggerConfig, TrainerConfig
from hpctrain.observe.loggers import Observer, tensorboard_tag


def test_logging_cadence_suits_short_runs_and_honours_an_explicit_one():
    assert [TrainerConfig(max_steps=n).log_interval() for n in (5, 20, 100, 300, 5000)] == [1, 2, 10, 25, 25]
    assert TrainerConfig(max_steps=20, log_every=25).log_interval() == 25


def test_the_progress_bar_keeps_the_latest_loss(tmp_path: Path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    observer = Observer(LoggerConfig(), tmp_path, console, {})
    observer.start(0, 10, None)
    observer.log({"step": 2, "loss": 1.2345})
    observer.advance(3)  # a step without a logged record
    assert "loss 1.2345" in observer._progress.tasks[0].fields["info"]
    observer.close()


def test_tensorboard_tags_are_grouped():
    assert [tensorboard_tag(k) for k in ("loss", "val_loss", "lr", "tokens_per_s", "straggler_rank")] == [
        "loss/train",
        "loss/val",
        "optim/lr",
        "throughput/tokens_per_s",
        "stragglers/rank",
    ]
