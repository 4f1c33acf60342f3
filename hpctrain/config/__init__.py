"""The run's config: typed schemas, Hydra composition, one-line validation, and RunShape (every derived
number, computed once). Torch-free."""
