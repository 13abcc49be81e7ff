"""Searches around training: the LR range test (lr_finder), the batch-size finder (batch_size_finder),
micro-batches (micro_batching: trainer.micro_batch_size, `auto` searching its size), and Hydra sweeps (one
trial, its value back to the sweeper).

train.py imports each finder from its own module (deleting one touches no other); the modules inside import
each other directly."""

from trainkit.tuning.sweeps import run_trial

__all__ = ["run_trial"]
