"""Slurm: its formats and environment (pure), and every Slurm client command hpctrain runs (commands.py)."""
