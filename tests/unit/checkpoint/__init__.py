"""Fast tests of hpctrain.checkpoint."""
