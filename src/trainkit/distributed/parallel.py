"""How a model is spread over the processes of a run: one process, DDP or FSDP, behind one interface.
train.py calls these methods and never asks which one runs; what differs between them is here (FSDP's
mechanics in trainkit.distributed.fsdp).

    parallel = parallel_for(cfg, proc, device)      # distributed.name and the number of processes choose
    model = parallel.prepare(model)                  # before the optimizer takes the parameters (FSDP shards)
    trained = parallel.wrap(model, compile)          # what the loop calls: compiled, then DDP-wrapped
    with parallel.gradient_sync(trained, enabled), autocast(parallel.precision, device): ...  # a micro-step
    with parallel.full_parameters(model): evaluate(...)  # every rank holds the whole model
    parallel.save(checkpoints, state, model, optimizer, improved)   # last.pt and best.pt, or FSDP's last/
    state = parallel.load(checkpoint, model, optimizer, device)     # a resume: what Run.load_state_dict reads
    parallel.load_best(best, found, model, averaged) # rank 0's best.pt on every rank, for the test

A strategy of your own (tensor parallel, a CPU offload) is one more subclass and one more line in parallel_for.
"""

import contextlib
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel

from trainkit.checkpointing.checkpoint import (
    copy_checkpoint,
    load_checkpoint,
    restore_averaged,
    save_checkpoint,
    unwrap_model,
)
from trainkit.distributed import fsdp
from trainkit.distributed.process_group import ProcessInfo, broadcast_weights


class Parallel:
    """One process: the model as it is, the step autocast to `precision`, checkpoints written by rank 0.
    DDP and FSDP below change what they need; every method is a no-op or the plain thing here."""

    last = "last.pt"  # what save writes for a resume, under checkpoints/

    def __init__(self, precision: str = "fp32", is_main: bool = True):
        self.precision = precision  # what the step autocasts to (trainkit.runtime.autocast)
        self.is_main = is_main  # rank 0: it alone writes a checkpoint file

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model the optimizer is built on (it is on its device already)."""
        return model

    def wrap(self, model: nn.Module, compile: bool = False) -> nn.Module:
        """What the loop calls: `model` compiled (on its device), or `model` itself."""
        # torch.compile of a module is a module (OptimizedModule), though torch types its result as a callable.
        return torch.compile(model) if compile else model  # type: ignore[return-value]

    def gradient_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        """Around a micro-step's backward: `enabled=False` on those that do not update (the gradients
        accumulate on each rank and are reduced once, on the update's last micro-step)."""
        return contextlib.nullcontext()

    def full_parameters(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Every rank holds the whole model inside: one rank may run a forward the others do not."""
        return contextlib.nullcontext()

    def save(
        self, checkpoints: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, improved: bool
    ) -> bool:
        """checkpoints/last.pt, and best.pt when `improved`, atomically; `state` is Run.state_dict() (every
        rank calls this). False, and nothing written, when the weights are not finite."""
        if not self.is_main:  # every rank holds the same weights; rank 0 writes them
            return True
        weights = [tensor for tensor in state["model"].values() if tensor.is_floating_point()]
        if not torch.stack([tensor.isfinite().all() for tensor in weights]).all():
            return False
        last = checkpoints / self.last
        save_checkpoint(last, state)
        if improved:
            copy_checkpoint(last, last.with_name("best.pt"))
        return True

    def load(
        self, checkpoint: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> dict:
        """The checkpoint a resume continues from, as Run.load_state_dict reads it."""
        return load_checkpoint(checkpoint, device)

    def load_best(self, checkpoint: dict | None, found: bool, model: nn.Module, averaged: AveragedModel | None) -> None:
        """best.pt's weights (and their average, Run.averaged) on every rank: `checkpoint` is rank 0's (None on the
        others); `found` is the same on every rank, false where rank 0 has none (then the last weights are tested)."""
        if checkpoint:
            unwrap_model(model).load_state_dict(checkpoint["model"])
            restore_averaged(averaged, checkpoint)
        broadcast_weights(unwrap_model(model) if averaged is None else averaged.module)  # nodes need not share files


class DDP(Parallel):
    """distributed=ddp, or several processes torchrun or SLURM started: every rank holds the whole model,
    and DistributedDataParallel all-reduces the gradients during the backward."""

    def __init__(self, precision: str, is_main: bool, device: torch.device, sync_batchnorm: bool = False):
        super().__init__(precision, is_main)
        self.device, self.sync_batchnorm = device, sync_batchnorm

    def prepare(self, model: nn.Module) -> nn.Module:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model) if self.sync_batchnorm else model

    def wrap(self, model: nn.Module, compile: bool = False) -> nn.Module:
        # Compile on the device, then wrap (DDP broadcasts rank 0's initial weights to every rank).
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(super().wrap(model, compile), device_ids=device_ids)

    def gradient_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        assert isinstance(model, DistributedDataParallel), "gradient_sync takes what wrap returned"
        return contextlib.nullcontext() if enabled else model.no_sync()


class FSDP(Parallel):
    """distributed=fsdp (trainkit.distributed.fsdp): each rank holds 1/N of every parameter, gradient and
    optimizer state. The step autocasts nothing: the sharding's MixedPrecisionPolicy runs the blocks in
    `precision` already. Checkpoints: checkpoints/last/, every rank's shards; best.pt, the full weights."""

    last = "last/"

    def __init__(self, precision: str, is_main: bool, distributed: DictConfig, world_size: int):
        super().__init__("fp32", is_main)
        self.parameter_precision, self.distributed, self.world_size = precision, distributed, world_size

    def prepare(self, model: nn.Module) -> nn.Module:
        return fsdp.shard_model(model, self.distributed, self.parameter_precision, self.world_size)  # in place

    def gradient_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if enabled else fsdp.without_gradient_sync(model)

    def full_parameters(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        return fsdp.full_parameters(model, enabled)

    def save(
        self, checkpoints: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, improved: bool
    ) -> bool:
        return fsdp.save_sharded_checkpoints(checkpoints, state, model, optimizer, improved, self.is_main)

    def load(
        self, checkpoint: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> dict:
        return fsdp.load_sharded_checkpoint(checkpoint, model, optimizer)

    def load_best(self, checkpoint: dict | None, found: bool, model: nn.Module, averaged: AveragedModel | None) -> None:
        if found:  # rank 0's full weights, scattered into every rank's shards (an average of whole weights: refused)
            fsdp.load_full_weights(model, checkpoint["model"] if checkpoint else {})


def parallel_for(cfg: DictConfig, proc: ProcessInfo, device: torch.device) -> Parallel:
    """distributed=fsdp shards; several processes (distributed=ddp, or torchrun's or SLURM's, whatever
    distributed.name says) replicate; one process trains the model as it is."""
    if cfg.distributed.name == "fsdp":
        return FSDP(cfg.precision.name, proc.is_main, cfg.distributed, proc.world_size)
    if proc.world_size > 1:
        return DDP(cfg.precision.name, proc.is_main, device, cfg.distributed.sync_batchnorm)
    return Parallel(cfg.precision.name)
