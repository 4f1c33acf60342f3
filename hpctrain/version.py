"""hpctrain's version, in a module of its own: a room below observe/ can read it without importing the package
root (whose ``log_metrics`` reaches observe/)."""

__version__ = "0.1.0"
