"""Fast tests of hpctrain.plan."""
