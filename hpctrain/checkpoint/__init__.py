"""Checkpoints: one DCP checkpoint holds every Stateful of a run, committed atomically."""
