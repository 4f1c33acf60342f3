"""Fast tests of hpctrain.train."""
