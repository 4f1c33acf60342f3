"""Fast tests of hpctrain.cli."""
