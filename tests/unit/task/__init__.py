"""Fast tests of hpctrain.task."""
