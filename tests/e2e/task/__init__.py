"""End-to-end tests of hpctrain.task: the user's own training script on local ranks."""
