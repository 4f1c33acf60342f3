"""hpctrain: train PyTorch models on Slurm GPU clusters (and on this machine) from one Hydra config."""

__version__ = "0.1.0"
