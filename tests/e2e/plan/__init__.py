"""End-to-end tests of hpctrain.plan: the estimate against the tensors of real parallelized ranks."""
