"""Searches around training: the LR range test, the batch-size finder, and Hydra sweeps (one trial, its
value back to the sweeper).

train.py imports from here; the modules inside import each other directly."""

from trainkit.tuning.batch_size_finder import find_batch_size_for_run
from trainkit.tuning.lr_finder import lr_range_test_for_run, set_base_lr
from trainkit.tuning.sweeps import run_trial
from trainkit.tuning.trial_gpus import gpus_for_this_trial

__all__ = ["find_batch_size_for_run", "gpus_for_this_trial", "lr_range_test_for_run", "run_trial", "set_base_lr"]
