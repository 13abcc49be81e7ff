"""Checkpoints and what continues from them: atomic, versioned checkpoint files, resume (the
checkpoint's config with this command's overrides), every RNG stream, and stop signals (save at the step, exit 75).

train.py imports from here; the modules inside import each other directly."""

from trainkit.checkpointing.checkpoint import (
    copy_checkpoint,
    load_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
    unwrap_model,
)
from trainkit.checkpointing.continued_run import finished_value
from trainkit.checkpointing.resume import resumed_config
from trainkit.checkpointing.rng import rng_states
from trainkit.checkpointing.signals import STOP_SIGNAL_NAMES, stop_signal, stopped

__all__ = [
    "STOP_SIGNAL_NAMES",
    "copy_checkpoint",
    "finished_value",
    "load_checkpoint",
    "restore_training_state",
    "resumed_config",
    "rng_states",
    "save_checkpoint",
    "stop_signal",
    "stopped",
    "training_state",
    "unwrap_model",
]
