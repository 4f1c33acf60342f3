"""hpctrain's tests: tests/README.md describes the tiers."""
