"""Fast tests of hpctrain.verify."""
