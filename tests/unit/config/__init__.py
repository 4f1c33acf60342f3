"""Fast tests of hpctrain.config."""
