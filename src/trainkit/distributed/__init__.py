"""Processes: the process group and its collectives (process_group), how a model is spread over them (parallel), the
run's function inside its process group (launch), torchrun under Hydra (torchrun_hydra). Here: what train.py calls of
the process group (parallel_for and start_processes need trainkit.checkpointing, which needs the process group)."""

from trainkit.distributed.process_group import (
    ProcessInfo,
    any_rank,
    average_batchnorm_statistics,
    barrier,
    gather_objects,
    process_info,
)

__all__ = ["ProcessInfo", "any_rank", "average_batchnorm_statistics", "barrier", "gather_objects", "process_info"]
