"""The rules of each config group, one module per family (run by hpctrain.config.validate.validate)."""
