"""The non-finite guard (``trainer.nonfinite``): a step whose loss or gradient norm is not finite on any rank
changes nothing.

Before ``optimizer.step`` every rank contributes one flag (its loss or its gradient norm is NaN or ±inf) to
one all-reduce (MAX) over the whole job, so every rank — every data-parallel replica, tensor and pipeline
stage — takes the same decision at the same step. Under fp16 the gradient scaler already skips steps whose
gradients overflowed (that is how it finds its scale), so there only the loss is judged.

What follows a bad step (:class:`Guard`):

- ``skip``: no optimizer step, no scheduler step (weights, optimizer state and the learning-rate schedule
  are bitwise what they were before the step); the batch is consumed and the step counted and logged: every
  skipped step has its line in metrics.jsonl, logging step or not, ``"nonfinite": true``, its numbers that
  are not finite written as ``null`` (:mod:`hpctrain.observe.loggers`). More than
  ``trainer.max_nonfinite_skips`` in a row stop the run (:class:`NonFiniteStop`).
- ``rollback``: the run goes back to its newest checkpoint (rebuilt in this process) and trains on, past the
  batches that went bad (their steps are skipped as above): for a fault that corrupted state before the guard
  could see it.
- ``stop``: the run ends at once with the step named; nothing of that step is saved, and no restart or
  requeue follows (the same data would fail the same way).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

MODES = ("skip", "rollback", "stop")


class NonFiniteStop(RuntimeError):
    """The run ends at a non-finite step (``trainer.nonfinite=stop``, or too many skips in a row)."""


class Rollback(Exception):
    """Go back to the newest checkpoint and skip ``step`` on the way forward."""

    def __init__(self, step: int) -> None:
        super().__init__(f"roll back past step {step}")
        self.step = step


def agree_bad(
    loss: torch.Tensor, grad_norm: torch.Tensor, judge_grads: bool, codes: Sequence[int] = ()
) -> tuple[bool, tuple[int, ...]]:
    """Whether any rank's loss (or, with ``judge_grads``, gradient norm) is not finite, and the maximum over
    the ranks of each of ``codes`` (the stop check's: hpctrain.resilience.stop), in one all-reduce: the
    step's one collective of its own."""
    bad = ~torch.isfinite(loss.detach().float())
    if judge_grads:
        bad = bad | ~torch.isfinite(grad_norm.detach().float())
    flag = torch.cat(
        [bad.to(torch.int64).reshape(1), torch.tensor(codes, dtype=torch.int64, device=bad.device)]
    )
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    first, *rest = (int(v) for v in flag.tolist())
    return bool(first), tuple(rest)


class Guard:
    """One run's answer to its non-finite steps (counting skips in a row)."""

    def __init__(self, mode: str, max_skips: int) -> None:
        self.mode = mode
        self.max_skips = max_skips
        self.in_a_row = 0
        self.steps = 0  # steps this attempt trained, finite or not

    def good(self) -> None:
        self.in_a_row = 0
        self.steps += 1

    def bad(self, step: int, loss: float, grad_norm: float, last: bool = False) -> None:
        """After a non-finite ``step`` whose update was not applied: return to skip it, or raise. ``last``:
        the run's last step, which ends the run FAILED when no step since it (re)started was finite: a run
        that trained nothing must not read as one that succeeded."""
        what = f"step {step}: loss {loss}, gradient norm {grad_norm}"
        self.steps += 1
        if self.mode == "stop":
            raise NonFiniteStop(f"non-finite {what}; trainer.nonfinite=stop: nothing of this step is saved")
        if self.mode == "rollback":
            log.warning(
                "Non-finite %s: rolling back to the newest checkpoint, then skipping this batch", what
            )
            raise Rollback(step)
        self.in_a_row += 1
        if last and self.in_a_row == self.steps:
            raise NonFiniteStop(
                f"non-finite {what}: all {self.steps} step(s) this attempt trained were non-finite (nothing "
                "was learned); look at the model's output and the loss"
            )
        if self.in_a_row > self.max_skips:
            raise NonFiniteStop(
                f"non-finite {what}: {self.in_a_row} in a row, over trainer.max_nonfinite_skips="
                f"{self.max_skips}; nothing of these steps is saved"
            )
        log.warning(
            "Non-finite %s: skipped (no optimizer or scheduler step; %d in a row)", what, self.in_a_row
        )
