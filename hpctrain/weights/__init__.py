"""Weights in and out: start a run from weights a user has (init_from), export a checkpoint as one model,
sample text from saved weights. Nothing but tensors and plain data is ever unpickled."""
