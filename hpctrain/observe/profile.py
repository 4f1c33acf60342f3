"""torch.profiler traces of a window of steps (``trainer.profile=FIRST:LAST``), one file per rank."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.config.schema import Config
from hpctrain.rundir import RunDir


def profile_dir(cfg: Config, run_dir: Path) -> Path:
    """RUN_DIR/profile, or with TensorBoard where its profiler plugin looks: LOGDIR/plugins/profile/RUN."""
    if cfg.logger.tensorboard and cfg.trainer.profile:
        window = cfg.trainer.profile.replace(":", "-")
        return RunDir(run_dir).tensorboard_profile(window)
    return RunDir(run_dir).profile


def start_profiler(directory: Path, rank: int, device: torch.device) -> torch.profiler.profile:
    """A torch.profiler trace of the coming steps, written as DIRECTORY/rank<R>.*.pt.trace.json (Chrome
    trace format: TensorBoard's profiler plugin and ui.perfetto.dev read it)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        record_shapes=True,
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(directory), f"rank{rank}"),
    )
    profiler.start()
    return profiler
