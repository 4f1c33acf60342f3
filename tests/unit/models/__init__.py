"""Fast tests of hpctrain.models."""
