"""End-to-end tests of hpctrain.rundir: the run directory's lock held by a live run."""
