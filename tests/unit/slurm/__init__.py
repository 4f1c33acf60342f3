"""Fast tests of hpctrain.slurm."""
