"""Which process am I, and the collectives that keep every rank's view of the run identical.

Every helper here also works in a plain single process (world size 1, no process group).
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ProcessInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files, prints progress and talks to trackers."""
        return self.rank == 0


def process_info() -> ProcessInfo:
    """Read the rank from torchrun's environment variables; a plain run is rank 0 of 1."""
    return ProcessInfo(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks, in place (no-op in a single process)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when any rank says True: every rank then takes the same branch (e.g. stop)."""
    if not is_distributed():
        return flag
    value = torch.tensor(float(flag), device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def barrier() -> None:
    if is_distributed():
        dist.barrier()
