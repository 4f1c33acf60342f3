"""End-to-end tests of hpctrain.data: prepare's worker processes and signals, training on a token file."""
