"""Which rank holds the others back? Per-rank phase times, gathered every N steps, the slowest one named.

A synchronous step takes as long as its slowest rank: the others wait for it inside the next collective, so
every rank's wall-clock step time is the same and says nothing. What differs is the time each rank spends
on its own, before it can join a collective:

- ``data_s``: fetching its batch (entirely local: no collective runs in it);
- ``probe_s``: a fixed matrix multiplication timed on its device, a measure of how fast its device computes
  right now (a throttled GPU, a CPU shared with another job).

The rank whose data time or probe time exceeds the median by the largest factor is the straggler; its rank,
host and that factor go into the metrics.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

PROBE_SIZE = 512  # 2·512³ ≈ 0.27 GFLOP: a few ms on a CPU core, microseconds on a GPU
PROBE_REPEATS = 3
WARN_AT = 1.25  # report a straggler in the log once it is 25 % slower than the median rank
# ... and slower by at least this much: a rank that holds its peers back by less than 10 ms a step is noise
# (0.0004 s against a median of 0.0002 s is twice as slow and costs nothing).
WARN_FLOOR_S = 0.010


class StragglerMonitor:
    def __init__(self, every: int, device: torch.device, hostname: str) -> None:
        self.every = every
        self.device = device
        self.enabled = every > 0 and dist.is_initialized() and dist.get_world_size() > 1
        self._data: list[float] = []
        self.hosts: list[str] = []
        if self.enabled:
            self.hosts = [""] * dist.get_world_size()
            dist.all_gather_object(self.hosts, hostname)

    def data_done(self, seconds: float) -> None:
        self._data.append(seconds)

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def report(self) -> dict[str, float | int | str]:
        """Gather every rank's times (a collective: all ranks call it on the same step); rank 0's return
        value names the straggler."""
        mine = torch.tensor(
            [statistics.fmean(self._data) if self._data else 0.0, self._probe()],
            dtype=torch.float64,
            device=self.device,
        )
        self._data.clear()
        everyone = torch.empty(dist.get_world_size() * 2, dtype=torch.float64, device=self.device)
        # torch 2.13 renamed all_gather_into_tensor to all_gather_single; the old name warns on every call.
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(everyone, mine)
        times = everyone.view(-1, 2).cpu().tolist()
        worst: tuple[float, int, str, float] = (0.0, 0, "", 0.0)
        for column, phase in enumerate(("data", "compute")):
            values = [row[column] for row in times]
            median = statistics.median(values)
            rank = max(range(len(values)), key=values.__getitem__)
            factor = values[rank] / median if median > 0 else 1.0
            worst = max(worst, (factor, rank, phase, values[rank] - median))
        factor, rank, phase, excess = worst
        record: dict[str, float | int | str] = {
            "straggler_rank": rank,
            "straggler_host": self.hosts[rank],
            "straggler_phase": phase,
            "straggler_slowdown": round(factor, 3),
            "data_s_max": max(row[0] for row in times),
            "data_s_median": statistics.median(row[0] for row in times),
        }
        if factor >= WARN_AT and excess >= WARN_FLOOR_S and dist.get_rank() == 0:
            log.warning(
                "Straggler: rank %d on %s is %.2f× the median rank in %s (data %s s, probe %s s per rank)",
                rank,
                self.hosts[rank],
                factor,
                phase,
                [round(row[0], 4) for row in times],
                [round(row[1], 4) for row in times],
            )
        return record

    def _probe(self) -> float:
        a = torch.ones(PROBE_SIZE, PROBE_SIZE, device=self.device)
        samples = []
        for _ in range(PROBE_REPEATS):
            _synchronize(self.device)
            start = time.perf_counter()
            a @ a
            _synchronize(self.device)
            samples.append(time.perf_counter() - start)
        return min(samples)  # the least disturbed run: what the device can do


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
