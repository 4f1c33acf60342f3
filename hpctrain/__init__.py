"""hpctrain: train PyTorch models on Slurm GPU clusters (and on this machine) from one Hydra config."""

__version__ = "0.1.0"


def log_metrics(step: int, **values: float) -> None:
    """From a ``task=script`` script: one line of the run's metrics.jsonl (rank 0), so ``hpctrain status``,
    ``summary`` and ``report`` see the script's progress (:mod:`hpctrain.observe.script`)."""
    from hpctrain.observe.script import log_metrics as log

    log(step, **values)
