"""Apply a parallelism strategy to a plain model from the outside (models never import this package)."""

from hpctrain.parallel.apply import parallelize

__all__ = ["parallelize"]
