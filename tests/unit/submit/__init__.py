"""Fast tests of hpctrain.submit."""
