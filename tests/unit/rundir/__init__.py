"""Fast tests of hpctrain.rundir."""
