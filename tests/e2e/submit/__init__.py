"""End-to-end tests of hpctrain.submit: sweeps through Hydra's sweepers, run here."""
