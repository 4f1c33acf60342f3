"""Fast tests of hpctrain.weights."""
