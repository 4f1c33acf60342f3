"""Fast tests of hpctrain.parallel."""
