"""Processes: the process group and its collectives (sums, agreement, weights), how a model is spread
over them (parallel: one process, DDP, or a strategy of its own in a module of its own, which
distributed.parallel names), the run's function inside its process group (launch), and torchrun under Hydra.

train.py imports the process group's functions from here, and parallel_for and start_processes from
their modules (they import trainkit.checkpointing, which needs the process group: importing them here
would go round in a circle). The modules inside import each other directly, in one direction:
process_group <- parallel <- a strategy's own module; process_group <- launch."""

from trainkit.distributed.process_group import (
    ProcessInfo,
    all_reduce_sum,
    any_rank,
    average_batchnorm_statistics,
    barrier,
    broadcast_weights,
    destroy_process_group,
    gather_objects,
    init_process_group,
    process_info,
)

__all__ = [
    "ProcessInfo",
    "all_reduce_sum",
    "any_rank",
    "average_batchnorm_statistics",
    "barrier",
    "broadcast_weights",
    "destroy_process_group",
    "gather_objects",
    "init_process_group",
    "process_info",
]
