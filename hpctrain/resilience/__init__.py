"""Surviving pre-emption, time limits and faults: signals, the walltime guard, requeue (Slurm side)."""
