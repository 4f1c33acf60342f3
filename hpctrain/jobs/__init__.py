"""Runs after submission: what a TARGET names (run directory, sweep, job id), its state, progress and
summary rows. No torch import here."""
