"""Submission: everything between the command line and a launcher. Compose every member of a sweep, check
it (config, the user's code on the meta device, whether it fits), then hand it to Hydra and a launcher.
Torch-free except where a user's own model must be built to be probed or measured (probe.py, footprint.py)."""
