"""End-to-end tests of hpctrain.weights: export, init_from and generate on trained runs."""
