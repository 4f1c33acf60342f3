"""Fast tests of hpctrain.faults."""
