"""Searches around training: the LR range test (lr_finder), the batch-size finder (batch_size_finder),
trainer.micro_batch_size=auto's search (micro_batching; a fixed size is trainkit.tasks.task.micro_batches), a GPU
per sweep trial (trial_gpus), and Hydra sweeps (one trial, its value back to the sweeper).

train.py imports each finder from its own module (deleting one touches no other); the modules inside import
each other directly."""

from trainkit.tuning.sweeps import run_trial

__all__ = ["run_trial"]
