"""Searches around training: the LR range test (lr_finder), the batch-size finder (batch_size_finder),
trainer.micro_batch_size=auto's search (micro_batching; a fixed size is trainkit.tasks.task.micro_batches), a GPU
per sweep trial (trial_gpus), a failed sweep trial that costs one trial (trial_failures), an Optuna search's
direction (sweep_direction).

train.py imports each finder from its own module (deleting one touches no other); the modules inside import
each other directly."""
