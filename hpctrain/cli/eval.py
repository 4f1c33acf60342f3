"""``hpctrain eval RUN_DIR [--step N] [OVERRIDES...]``: the run's own validation of one committed checkpoint
(the latest by default), here in one process; the result is appended to ``RUN_DIR/eval.jsonl`` and shown by
``hpctrain status`` and ``summary``. OVERRIDES change the evaluation (``trainer.eval_batches=8``);
``eval._target_=package.module.function`` evaluates with the user's function instead
(:mod:`hpctrain.task.evaluate`).

A bad argument (a step never saved, a key the run's config lacks, a control character) is one line on
stderr and exit status 2; nothing is written. Imports torch when it runs (not on the submit path).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from hpctrain.cli.common import Parser
from hpctrain.config.sanity import check_text
from hpctrain.errors import ConfigError
from hpctrain.rundir import RunDir, eval_metrics


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="hpctrain eval", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    p.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDES",
        help="e.g. trainer.eval_batches=8, or eval._target_=mynets.metrics.score",
    )
    return p


def run(name: str, argv: list[str]) -> int:
    args = _parser().parse_or_exit(argv, intermixed=True)
    if isinstance(args, int):
        return args
    try:
        check_text("RUN_DIR", args.run_dir)
        for override in args.overrides:
            check_text("OVERRIDES", override)
        from hpctrain.task.evaluate import evaluate_checkpoint

        try:
            record = evaluate_checkpoint(Path(args.run_dir), args.step, list(args.overrides))
        except BaseException as err:  # its own failure: the pin must not keep the checkpoint for ever
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            _release_pin(Path(args.run_dir), args.step, f"failed: {first_line}")
            raise
        _release_pin(Path(args.run_dir), args.step, "read")
    except ConfigError as err:
        user_traceback = getattr(err, "user_traceback", None)  # eval._target_ raised: show where, above
        if user_traceback:
            print(user_traceback, file=sys.stderr, end="")
        print(f"hpctrain: {err}", file=sys.stderr)
        return 2
    shown = ", ".join(f"{k} {v:.4f}" for k, v in eval_metrics(record).items())
    print(f"step {record['step']}: {shown} ({record['eval_s']:.1f} s) → {RunDir(Path(args.run_dir)).evals}")
    return 0


def _release_pin(run_dir: Path, step: int | None, how: str) -> None:
    """An evaluation job of ``trainer.eval_job`` (the training job exported the step it submitted it for)
    releases the pin that kept its checkpoint from pruning, with how it ended: "read" (evaluated), or why
    not, which ``hpctrain status`` shows. Someone's own ``hpctrain eval`` leaves the job's pin alone."""
    from hpctrain.slurm.commands import EVAL_STEP_ENV

    own_job = os.environ.get("SLURM_JOB_ID")
    if step is None or os.environ.get(EVAL_STEP_ENV) != str(step) or not own_job:
        return
    run = RunDir(run_dir)
    pin = run.read_eval_pins().get(step)
    # The pin's job id is None when this job started before the training job's sbatch call returned.
    if pin is None or pin.get("released") is not None or pin.get("job_id") not in (None, own_job):
        return
    with contextlib.suppress(OSError):  # unwritable: the pruner releases it once this job has ended
        run.write_eval_pin(step, own_job, released=how)
