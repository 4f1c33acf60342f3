"""Fast tests of hpctrain.resilience."""
