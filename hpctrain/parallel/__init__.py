"""Apply a parallelism strategy to a plain model from the outside (models never import this package).

Importing the package does not import torch: :mod:`hpctrain.config.shape` runs on the submit path.
The strategies live in :mod:`hpctrain.parallel.apply` and the modules beside it.
"""
