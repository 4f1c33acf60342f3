"""Fast tests of hpctrain.launch."""
