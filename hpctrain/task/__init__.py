"""What a worker runs on its rank: hpctrain's trainer (train.py) or the user's own script (script.py)."""
