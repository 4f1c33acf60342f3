"""Hydra finds launcher plugins in the ``hydra_plugins`` namespace package; the logic lives in hpctrain."""
