"""End-to-end tests of hpctrain.checkpoint: resume, reshard, async saves, damaged checkpoints; real runs."""
