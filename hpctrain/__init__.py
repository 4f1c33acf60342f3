"""hpctrain: train PyTorch models on Slurm GPU clusters (and on this machine) from one Hydra config."""

from hpctrain.version import __version__

__all__ = ["__version__", "log_metrics"]


def log_metrics(step: int, **values: float) -> None:
    """From a ``task=script`` script: one line of the run's metrics.jsonl (rank 0), so ``hpctrain status``,
    ``summary`` and ``report`` see the script's progress (:mod:`hpctrain.observe.script`)."""
    from hpctrain.observe.script import log_metrics as log

    log(step, **values)
