"""trainkit: the pieces that train.py calls. Each module holds one concern."""
