"""How a model is spread over a run's processes: one process, DDP, or a strategy `distributed.parallel` names (a
subclass of Parallel with a `for_run` class method), behind one interface train.py calls without asking which runs
(parallel_for builds it; docs/distributed.md's table says what each method does for each)."""

import contextlib
import importlib
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
from trainkit.distributed.process_group import ProcessInfo, broadcast_weights
from trainkit.errors import ConfigError


class Parallel:
    """One process: the model as it is, the step autocast to `precision`, checkpoints written by rank 0."""

    last = "last.pt"  # what save writes for a resume, under checkpoints/ ("last/": a folder of every rank's shards)

    def __init__(self, precision: str = "fp32", is_main: bool = True):
        self.precision = precision  # what the step autocasts to (trainkit.runtime.autocast)
        self.is_main = is_main  # rank 0: it alone writes a checkpoint file

    @classmethod
    def for_run(cls, cfg: DictConfig, proc: ProcessInfo, device: torch.device) -> "Parallel":
        """Built for this run: several processes replicate the model (DDP), one trains it as it is."""
        if proc.world_size > 1:
            return DDP(cfg.precision.name, proc.is_main, device, cfg.distributed.sync_batchnorm)
        return Parallel(cfg.precision.name)

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model the optimizer is built on (it is on its device already)."""
        return model

    def wrap(self, model: nn.Module, compile: bool = False) -> nn.Module:
        """What the loop calls: `model` compiled (on its device), or `model` itself."""
        # torch.compile of a module is a module (OptimizedModule), though torch types its result as a callable.
        return torch.compile(model) if compile else model  # type: ignore[return-value]

    def gradient_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        """Around a micro-step's backward: `enabled=False` on those that do not update."""
        return contextlib.nullcontext()

    def full_parameters(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Every rank holds the whole model inside: one rank may run a forward the others do not."""
        return contextlib.nullcontext()

    def grad_norm(self, model: nn.Module, max_norm: float | None = None) -> torch.Tensor:
        """The norm of all the gradients as one 0-d tensor (unscale fp16 ones first), clipped to `max_norm` if given."""
        if max_norm:
            return nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norms = [torch.linalg.vector_norm(p.grad) for p in model.parameters() if p.grad is not None]
        # As clip_grad_norm_ computes it (torch >= 2.4), 0 where no weight has a gradient (all frozen) as it says.
        return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.tensor(0.0)

    def save(
        self, checkpoints: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, improved: bool
    ) -> bool:
        """checkpoints/last.pt, and best.pt when `improved`, atomically (every rank calls this). False, and nothing
        written, when the weights are not finite."""
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
    """Several processes, each holding the whole model; DistributedDataParallel all-reduces the gradients."""

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


def parallel_for(cfg: DictConfig, proc: ProcessInfo, device: torch.device) -> Parallel:
    """This run's Parallel: built by the class `distributed.parallel` names, else by Parallel.for_run."""
    return strategy(cfg.distributed.get("parallel")).for_run(cfg, proc, device)


def strategy(named: str | None) -> type[Parallel]:
    """The class `distributed.parallel` names, imported, not built (Parallel where none); refused if not importable."""
    if not named:
        return Parallel
    module, _, name = named.rpartition(".")
    found = None
    with contextlib.suppress(ImportError):
        found = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(found, type) and issubclass(found, Parallel)):
        raise ConfigError(
            "distributed.parallel",
            f"names {named}, which is no subclass of trainkit.distributed.parallel.Parallel that can be imported; "
            "use a conf/distributed option (distributed=ddp), or name one as module.Class",
        )
    return found
