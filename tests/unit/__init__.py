"""The fast tier: pure, in-process tests, one folder per room of hpctrain/."""
