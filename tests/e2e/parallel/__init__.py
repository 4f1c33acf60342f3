"""End-to-end tests of hpctrain.parallel: every layout against one process, on gloo ranks."""
