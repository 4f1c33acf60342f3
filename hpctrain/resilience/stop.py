"""The per-step question "do we stop now?", answered the same on every rank.

Two codes, their maximum over the ranks taken in one all-reduce per step: a stop code (a signal that
reached any rank, or rank 0's walltime guard) and an operator's request (``hpctrain save|stop RUN_DIR``:
RUN_DIR/control.json, which rank 0 looks at when its modification time changed), so every rank stops, or
saves and trains on, at the same step boundary. The trainer sends them in its step's own all-reduce, its
non-finite guard's (:meth:`StopCheck.codes` before the step, :meth:`StopCheck.decide` after it): a second
collective per step cost the race against a hand-written loop 0.5 % (a profile of bench/race.py's run).
So the codes are taken before a step and acted on after it: a signal that arrives during a step stops the
run one step later than it would be seen at the step's end (``cluster.signal_lead_s``, 120 s, leaves room
for it), and the walltime guard, which keeps two steps and one and a half saves free, counts the step in
flight as one of its two. Rank 0 answers the request in the same file once the checkpoint is committed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.resilience import walltime
from hpctrain.resilience.signals import WALLTIME, StopSignals, describe
from hpctrain.rundir import RunDir

SAVE, STOP = 1, 2  # an operator's requests, by rank 0's reading of control.json
USER_STOP = "a stop requested by the user (hpctrain stop)"


class StopCheck:
    def __init__(
        self,
        signals: StopSignals,
        end_time: float | None,
        is_main: bool,
        device: torch.device,
        run_dir: Path | None = None,
    ) -> None:
        self.signals = signals
        self.end_time = end_time  # only rank 0's guard decides: nodes' clocks may disagree by seconds
        self.is_main = is_main
        self.device = device
        self.run_dir = run_dir
        self.save_requested = False  # after a call: save this step (an operator's save or stop)
        self._request: dict[str, Any] | None = None  # rank 0: the request being answered
        self._seen_mtime = 0

    def __call__(self, step_s: float, save_s: float | None) -> str | None:
        """Why to stop after this step (a collective: every rank calls it at every step), or None."""
        flag = torch.tensor(self.codes(step_s, save_s), dtype=torch.int64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return self.decide(tuple(int(v) for v in flag.tolist()))

    def codes(self, step_s: float, save_s: float | None) -> list[int]:
        """This rank's side of the question: its stop code (a signal it received, rank 0's walltime guard
        with the last step's time) and the operator's new request (rank 0). The trainer sends them in its
        step's own all-reduce (hpctrain.train.nonfinite.agree_bad), then asks :meth:`decide`."""
        code = self.signals.received
        if not code and self.is_main and walltime.should_stop(time.time(), self.end_time, step_s, save_s):
            code = WALLTIME
        return [code, self._poll()]

    def decide(self, agreed: tuple[int, ...]) -> str | None:
        """Why to stop after this step, from :meth:`codes`' maximum over the ranks, or None."""
        code, request = agreed
        self.save_requested = request in (SAVE, STOP)
        if code:
            return describe(code)
        return USER_STOP if request == STOP else None

    def _poll(self) -> int:
        """Rank 0: the operator's new request (SAVE or STOP), or 0: a stat per step, a read on a change."""
        if not self.is_main or self.run_dir is None or self._request is not None:
            return 0
        try:
            mtime = os.stat(RunDir(self.run_dir).control).st_mtime_ns
        except OSError:
            return 0
        if mtime == self._seen_mtime:
            return 0
        self._seen_mtime = mtime
        record = RunDir(self.run_dir).read_control()
        if not record or "answered" in record or record.get("request") not in ("save", "stop"):
            return 0
        self._request = record
        return SAVE if record["request"] == "save" else STOP

    def answer(self, step: int) -> None:
        """Rank 0, once the requested checkpoint of ``step`` is committed: the request's answer."""
        if self._request is None or self.run_dir is None:
            return
        record = {**self._request, "answered": time.time(), "step": step}
        RunDir(self.run_dir).write_control(record)
        self._seen_mtime = os.stat(RunDir(self.run_dir).control).st_mtime_ns
        self._request = None
