"""An example user project for hpctrain: a model, datasets and a loss of one's own, outside the package."""
