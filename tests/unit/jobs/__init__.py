"""Fast tests of hpctrain.jobs."""
