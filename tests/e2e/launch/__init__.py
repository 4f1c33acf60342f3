"""End-to-end tests of hpctrain.launch: local launches, their signals and their environment."""
