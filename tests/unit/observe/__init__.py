"""Fast tests of hpctrain.observe."""
