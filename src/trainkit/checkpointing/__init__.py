"""Checkpoints and what continues from them: resume, every RNG stream, stop signals (what a checkpoint holds: see
trainkit/run.py). train.py imports from here; the modules inside import each other directly."""

from trainkit.checkpointing.checkpoint import (
    averaged_weights,
    load_checkpoint,
    load_weights,
    restore_averaged,
    restore_optimizer_and_schedule,
    save_checkpoint,
    unwrap_model,
)
from trainkit.checkpointing.continued_run import finished_value, trained_to_the_end, trim_records
from trainkit.checkpointing.resume import (
    epoch_plan,
    refuse_another_epoch_plan,
    refuse_another_world_size_inside_an_epoch,
    resumed_config,
)
from trainkit.checkpointing.rng import restore_rank_rng_states, rng_states
from trainkit.checkpointing.run_lock import own_run_directory
from trainkit.checkpointing.signals import (
    STOP_SIGNAL_NAMES,
    stop_after_the_test,
    stop_signal,
    stopped,
)

__all__ = [
    "STOP_SIGNAL_NAMES",
    "averaged_weights",
    "epoch_plan",
    "finished_value",
    "load_checkpoint",
    "load_weights",
    "own_run_directory",
    "refuse_another_epoch_plan",
    "refuse_another_world_size_inside_an_epoch",
    "restore_averaged",
    "restore_optimizer_and_schedule",
    "restore_rank_rng_states",
    "resumed_config",
    "rng_states",
    "save_checkpoint",
    "stop_after_the_test",
    "stop_signal",
    "stopped",
    "trained_to_the_end",
    "trim_records",
    "unwrap_model",
]
