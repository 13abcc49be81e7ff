"""Searches around training: the LR range test, the batch-size finder, micro-batches (trainer.micro_batch_size,
`auto` searching its size), and Hydra sweeps (one trial, its value back to the sweeper).

train.py imports from here; the modules inside import each other directly."""

from trainkit.tuning.batch_size_finder import find_batch_size_for_run
from trainkit.tuning.lr_finder import lr_range_test_for_run, set_base_lr
from trainkit.tuning.micro_batching import find_micro_batch_size_for_run, micro_batches
from trainkit.tuning.sweeps import run_trial

__all__ = [
    "find_batch_size_for_run",
    "find_micro_batch_size_for_run",
    "lr_range_test_for_run",
    "micro_batches",
    "run_trial",
    "set_base_lr",
]
