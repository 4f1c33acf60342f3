"""Fast tests of hpctrain.data."""
