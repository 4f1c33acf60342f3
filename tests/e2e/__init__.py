"""The end-to-end tier: the CLI in a subprocess, and multi-process (gloo) runs."""
