"""Processes: the process group and its collectives (sums, agreement, weights), starting DDP workers
for one run (launch), and torchrun under Hydra.

train.py imports the process group's functions from here, and start_processes from
trainkit.distributed.launch (it stops on signals, which need the process group: importing it here
would go round in a circle). The modules inside import each other directly."""

from trainkit.distributed.process_group import (
    ProcessInfo,
    all_reduce_sum,
    any_rank,
    average_batchnorm_statistics,
    barrier,
    broadcast_weights,
    destroy_process_group,
    gather_objects,
    gradient_sync,
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
    "gradient_sync",
    "init_process_group",
    "process_info",
]
