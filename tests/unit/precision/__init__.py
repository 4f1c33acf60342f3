"""Fast tests of hpctrain.precision."""
