"""End-to-end tests of hpctrain.observe: metrics, stragglers, profiles, loggers, reports."""
