"""Which process am I, the process group, and the collectives that keep every rank's view identical, however the
processes were started: by torchrun (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), by SLURM, one task per GPU
(SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, the node list), or by a feature with torchrun's environment. Every helper
also works in a single process (world size 1, no process group)."""

import datetime
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ProcessInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files, prints progress and talks to trackers."""
        return self.rank == 0


def process_info() -> ProcessInfo:
    """This process's place in the job: torchrun's variables first, then SLURM's, else rank 0 of 1."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world_size = int(env["WORLD_SIZE"])
        return ProcessInfo(
            int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), world_size, int(env.get("LOCAL_WORLD_SIZE", world_size))
        )
    if int(env.get("SLURM_NTASKS", 1)) > 1:
        world_size = int(env["SLURM_NTASKS"])
        tasks_here = env.get("SLURM_NTASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", str(world_size)))
        count = re.match(r"\d+", tasks_here)  # SLURM writes e.g. 4, or 2(x3): 2 tasks on each of 3 nodes
        assert count is not None, f"unexpected SLURM tasks per node: {tasks_here!r}"
        return ProcessInfo(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), world_size, int(count.group()))
    return ProcessInfo()


def launched_externally() -> bool:
    """True under torchrun or a multi-task SLURM step: the processes exist already."""
    return process_info().world_size > 1


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list such as `gpu[03-05,09],cpu1` -> `gpu03`."""
    try:
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return hosts.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
        assert match is not None, f"unexpected SLURM node list: {nodelist!r}"  # it starts with a host name
        prefix, ranges = match.group(1), match.group(2)
        return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


_joined_a_process_group = False


def init_process_group(proc: ProcessInfo, device: torch.device, backend: str, timeout_seconds: float) -> None:
    """Join the job's process group (device already chosen from LOCAL_RANK). No-op for one process."""
    if proc.world_size == 1:
        return
    global _joined_a_process_group
    _joined_a_process_group = True
    env = os.environ
    if "SLURM_PROCID" in env and "RANK" not in env:
        # SLURM without torchrun: MASTER_ADDR/PORT derived the same way on every task, the first node of the job and
        # a port from the job id (so two jobs on one node do not collide).
        if "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = first_slurm_host(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1")))
        env.setdefault("MASTER_PORT", str(15000 + int(env.get("SLURM_JOB_ID", 0)) % 20000))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group, so NCCL binds this rank to its own GPU
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_seconds)
    device_id = device if device.type == "cuda" else None
    dist.init_process_group(
        backend, init_method="env://", rank=proc.rank, world_size=proc.world_size, timeout=timeout, device_id=device_id
    )


def destroy_process_group() -> None:
    if is_distributed():
        dist.destroy_process_group()


def exit_now_if_a_process_group_was_joined(code: object) -> None:
    """End a process that trained as a rank (torchrun, srun) without C++ exit-time destructors: DDP leaks its process
    group, whose gloo threads still run at exit; a normal exit then sometimes aborts a finished rank (SIGABRT) and
    torchrun reports the job failed. Everything is written by now: flush and leave at once."""
    if not _joined_a_process_group:
        return
    if code is not None and not isinstance(code, int):  # sys.exit("message") prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


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


def broadcast_weights(model: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (no shared file system needed)."""
    if is_distributed():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def average_batchnorm_statistics(model: torch.nn.Module) -> None:
    """Make BatchNorm running statistics the mean over ranks, so evaluation and checkpoints do
    not depend on rank 0's shard alone (SyncBatchNorm does this per step, on GPUs only)."""
    if not is_distributed():
        return
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            for buffer in (module.running_mean, module.running_var):
                assert buffer is not None  # track_running_stats: the buffers exist
                dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
                buffer /= dist.get_world_size()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank ([obj] in a single process)."""
    if not is_distributed():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
