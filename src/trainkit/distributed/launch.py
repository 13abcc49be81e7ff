"""Run a script's training function inside the run's process group, in each process that trains (start_processes)."""

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from trainkit.checkpointing.signals import stop_if_requested_while_starting, stop_on_signals
from trainkit.distributed import local_launch  # feature: local_launch
from trainkit.distributed.process_group import (
    ProcessInfo,
    destroy_process_group,
    init_process_group,
    launched_externally,
    process_info,
)
from trainkit.errors import ConfigError
from trainkit.runtime import nondeterministic_op_errors, pick_device, set_math_modes


def start_processes(cfg: DictConfig, run_dir: Path, train_process: Callable[..., Any]) -> Any:
    """`train_process(cfg, run_dir, proc, device)` inside the run's process group: in this process, or in each of the
    processes torchrun or SLURM started. A run of several processes that finds none started is refused in one line
    (or, where the feature is, starts them here: trainkit.distributed.local_launch)."""
    if cfg.distributed.name != "none" and not launched_externally():
        start: Callable[..., Any] = refuse_unstarted_processes
        start = local_launch.start_workers  # feature: local_launch
        return start(cfg, run_dir, train_process)
    with stop_on_signals():
        stop_if_requested_while_starting(agree_later=launched_externally())
        with joined_process_group(cfg) as (proc, device):
            return train_process(cfg, run_dir, proc, device)


def refuse_unstarted_processes(cfg: DictConfig, run_dir: Path, train_process: Callable[..., Any]) -> Any:
    raise ConfigError(
        "distributed.name",
        f"is {cfg.distributed.name}, a run of several processes, but none were started for it; start them with "
        f"torchrun (torchrun --nproc_per_node=N {Path(sys.argv[0]).name} distributed={cfg.distributed.name} ...) "
        f"or SLURM, or train in one process (distributed=none)",
    )


@contextlib.contextmanager
def joined_process_group(cfg: DictConfig) -> Iterator[tuple[ProcessInfo, torch.device]]:
    """This process's place and device (from LOCAL_RANK, math modes set) in the run's process group, left after."""
    proc = process_info()
    device = pick_device(cfg.device, proc.local_rank)
    # The training's trainer.deterministic too (eval.py reads the checkpoint's config; older ones lack the key).
    deterministic = bool(cfg.trainer.get("deterministic", False))
    set_math_modes(cfg.precision.tf32, cfg.trainer.cudnn_benchmark, device, deterministic)
    init_process_group(proc, device, cfg.distributed.backend, cfg.distributed.timeout_seconds)
    try:
        with nondeterministic_op_errors():  # an op without a deterministic kernel: one line naming the switch
            yield proc, device
    finally:
        destroy_process_group()
