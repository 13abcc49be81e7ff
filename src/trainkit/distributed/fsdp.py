"""distributed=fsdp: shard parameters, gradients and optimizer state across ranks (FSDP2's `fully_shard`).
conf/distributed/fsdp.yaml names `FSDP` (distributed.parallel) and this module's checks (`_checks_`); deleting them,
scripts/fsdp_memory.py and the tests deletes FSDP (docs/features.md).

    shard_model(model, cfg.distributed, cfg.precision.name)      # in place, before the optimizer is built
    with full_parameters(model): evaluate(...)                    # every rank holds the whole model to evaluate
    with without_gradient_sync(model): loss.backward()            # a micro-step that does not update
    save_sharded_checkpoints(checkpoints_dir, state, model, ...)  # checkpoints/last/ (DCP), best.pt (full weights)
    state = load_sharded_checkpoint(directory, model, optimizer)  # resume: what Run.load_state_dict reads

A block's whole parameters exist only while it runs (`distributed.blocks` says what a block is). BatchNorm buffers
are not sharded: as under DDP, rank 0's are broadcast before each training forward.
"""

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn
from torch.optim.swa_utils import AveragedModel

from trainkit.checkpointing.checkpoint import save_checkpoint
from trainkit.checkpointing.files import CHECKPOINT_FORMAT, SHARDED_REST
from trainkit.config.schema import Relation, show
from trainkit.distributed.parallel import Parallel
from trainkit.distributed.process_group import ProcessInfo, any_rank
from trainkit.errors import ConfigError

# torch.distributed.fsdp and .checkpoint take ~1 s to import: imported where a sharded model needs them.

PARAM_DTYPES = {"bf16": torch.bfloat16, "fp32": None}  # fp16 is refused by the checks below
NO_OPTIMIZER_STATE: dict = {"state": {}, "param_groups": []}  # best.pt's: a resume continues from last/


class FSDP(Parallel):
    """distributed=fsdp. The step autocasts nothing (the MixedPrecisionPolicy does). Checkpoints: checkpoints/last/,
    every rank's shards; best.pt, the full weights."""

    last = "last/"

    def __init__(self, precision: str, is_main: bool, distributed: DictConfig, world_size: int):
        super().__init__("fp32", is_main)
        self.parameter_precision, self.distributed, self.world_size = precision, distributed, world_size

    @classmethod
    def for_run(cls, cfg: DictConfig, proc: ProcessInfo, device: torch.device) -> "FSDP":
        return cls(cfg.precision.name, proc.is_main, cfg.distributed, proc.world_size)

    def prepare(self, model: nn.Module) -> nn.Module:
        return shard_model(model, self.distributed, self.parameter_precision, self.world_size)  # in place

    def gradient_sync(self, model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if enabled else without_gradient_sync(model)

    def full_parameters(self, model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        return full_parameters(model, enabled)

    def grad_norm(self, model: nn.Module, max_norm: float | None = None) -> torch.Tensor:
        # Each rank holds a shard of every gradient: full_tensor() combines the ranks' parts into the whole norm.
        return super().grad_norm(model, max_norm).full_tensor()  # type: ignore[attr-defined]

    def save(
        self, checkpoints: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, improved: bool
    ) -> bool:
        return save_sharded_checkpoints(checkpoints, state, model, optimizer, improved, self.is_main)

    def load(
        self, checkpoint: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> dict:
        return load_sharded_checkpoint(checkpoint, model, optimizer)

    def load_best(self, checkpoint: dict | None, found: bool, model: nn.Module, averaged: AveragedModel | None) -> None:
        if found:  # rank 0's full weights, scattered into every rank's shards (an average of whole weights: refused)
            load_full_weights(model, checkpoint["model"] if checkpoint else {})


# ---- its config checks (conf/distributed/fsdp.yaml's _checks_: gathered by trainkit.config) -----------------


def class_names(value: object) -> str | None:
    """distributed.blocks: null, or a list of module class names (`blocks` below)."""
    if value is None or (isinstance(value, ListConfig) and len(value) and all(isinstance(n, str) for n in value)):
        return None
    return f"must be null (the children of the model's top-level children) or a list of class names, got {show(value)}"


def refused_under_fsdp(why: str) -> str:
    """What a setting that needs whole, unsharded parameters says under distributed=fsdp (`why`: what it does)."""
    return f"{why}, but distributed=fsdp shards the parameters; train with distributed=ddp, or turn it off"


# Other features' settings that need whole weights: {key: (the setting refused, what is wrong)}.
WHOLE_WEIGHTS = {
    "regularization.ema.enabled": (True, refused_under_fsdp("averages whole weights")),
    "lr_finder.enabled": (True, refused_under_fsdp("saves and restores whole weights around its trial steps")),
    "batch_size_finder.enabled": (True, refused_under_fsdp("measures the unsharded model")),
    "trainer.micro_batch_size": (  # one rank out of memory in a sharded forward: the others would wait
        "auto",
        "auto searches on whole weights, but distributed=fsdp gathers them inside each forward; give a size "
        "(e.g. trainer.micro_batch_size=16)",
    ),
}


def _what_needs_whole_weights(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    for key, (refused, message) in WHOLE_WEIGHTS.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value == refused and type(value) is type(refused):
            yield key, message


def _what_fsdp_cannot_combine_with(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """fully_shard shards the parameters in place; these need whole, unsharded ones (or a GradScaler)."""
    refused = {
        "trainer.compile": (cfg.trainer.compile, "is not wired with fully_shard here"),
        "distributed.sync_batchnorm": (cfg.distributed.sync_batchnorm, "is not wired with fully_shard here"),
    }
    for key, (on, why) in refused.items():
        if on:
            yield key, refused_under_fsdp(why)
    if cfg.precision.name == "fp16":
        yield "precision", "fp16 needs a GradScaler, which distributed=fsdp does not shard here; use bf16 or fp32"
    if cfg.distributed.nproc_per_node == 1:
        yield "distributed.nproc_per_node", "is 1: one process has nothing to shard with; use distributed=none, or 2+"


CONFIG_RULES = {"distributed.blocks": class_names}
CONFIG_RELATIONS = (
    Relation(
        ("trainer.compile", "distributed.sync_batchnorm", "precision.name", "distributed.nproc_per_node"),
        _what_fsdp_cannot_combine_with,
    ),
    Relation(tuple(WHOLE_WEIGHTS), _what_needs_whole_weights),
)


def shard_model(model: nn.Module, cfg: DictConfig, precision: str, world_size: int | None = None) -> nn.Module:
    """`fully_shard` each block, then the root, in place, after broadcasting rank 0's weights and buffers. bf16:
    parameters run in bf16, gradients are reduced in fp32; BatchNorm stays fp32 in units of its own. One process is
    refused."""
    world_size = dist.get_world_size() if world_size is None else world_size
    if world_size < 2:
        raise ConfigError(
            "distributed.name",
            f"fsdp in {world_size} process has nothing to shard with (torchrun or SLURM started one); "
            "use distributed=none, or start 2+ processes",
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Each rank built its own weights (seed + rank) and fully_shard keeps each rank's own rows: broadcast first, as DDP.
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[precision], reduce_dtype=torch.float32)
    sharded: set[nn.Module] = set()
    if precision != "fp32":
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and _has_parameters(module):
                fully_shard(module, mp_policy=MixedPrecisionPolicy(cast_forward_inputs=False))
                sharded.add(module)
    for block in reversed(blocks(model, cfg.blocks)):  # inner blocks before the blocks holding them
        if block not in sharded:
            fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.register_forward_pre_hook(_broadcast_buffers_in_training)
    return model


def blocks(model: nn.Module, names: list[str] | None) -> list[nn.Module]:
    """The modules sharded one by one: those whose class is in `names`, else in the model's `block_names`, else each
    child of the top-level children; modules without parameters are left to the unit around them."""
    names = names or getattr(model, "block_names", None)
    if names:
        wanted = set(names)
        found = [module for module in model.modules() if type(module).__name__ in wanted and module is not model]
        if not found:
            present = sorted({type(module).__name__ for module in model.modules()})
            raise ConfigError(
                "distributed.blocks",
                f"names no module class of this model ({', '.join(names)}); it has {', '.join(present[:12])}",
            )
        return found
    return [block for child in model.children() for block in child.children() if _has_parameters(block)]


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _broadcast_buffers_in_training(model: nn.Module, _inputs: Any) -> None:
    if model.training and dist.is_initialized():
        broadcast_buffers(model)


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm statistics) on every rank, as DDP's broadcast_buffers does."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)


@contextlib.contextmanager
def full_parameters(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Every rank holds the whole model within, so one rank may run forwards the others do not (at the memory cost of
    the whole model, as under DDP)."""
    from torch.distributed.fsdp import FSDPModule

    units = [module for module in model.modules() if isinstance(module, FSDPModule)] if enabled else []
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


@contextlib.contextmanager
def without_gradient_sync(model: Any) -> Iterator[None]:
    """DDP's `no_sync()` for a sharded model: gradients are reduce-scattered once, in the update's last micro-step."""
    model.set_requires_gradient_sync(False)  # recurses into every sharded block
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def save_sharded_checkpoints(
    checkpoints: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, improved: bool, is_main: bool
) -> bool:
    """checkpoints/last/: every rank's shards (DCP), written to last.tmp/ and renamed once complete; when `improved`,
    best.pt with the full weights. `state`: Run.state_dict(). False, nothing written, if any weights are not finite."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    local = [tensor.to_local() if hasattr(tensor, "to_local") else tensor for tensor in model.state_dict().values()]
    finite = all(bool(tensor.isfinite().all()) for tensor in local if tensor.is_floating_point())
    if any_rank(not finite, next(model.parameters()).device):
        return False  # train.py warns; the non-finite loss that caused it stops the run at the next logging step
    broadcast_buffers(model)  # DCP saves one rank's copy of a replicated buffer: make them rank 0's
    rest = {key: value for key, value in state.items() if key not in ("model", "optimizer")}
    last, tmp, old = checkpoints / "last", checkpoints / "last.tmp", checkpoints / "last.old"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({"format": CHECKPOINT_FORMAT, **rest}, tmp / SHARDED_REST)
    dist.barrier()
    weights, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optimizer": optimizer_state}, checkpoint_id=tmp)  # .metadata last, then a barrier
    if is_main:
        if last.exists():
            os.replace(last, old)
        os.replace(tmp, last)
        shutil.rmtree(old, ignore_errors=True)
    if improved:  # a collective: the full weights, gathered on rank 0's CPU
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if is_main:  # the optimizer state stays in last/: best.pt is for evaluating and fine-tuning
            save_checkpoint(checkpoints / "best.pt", {**rest, "model": full, "optimizer": NO_OPTIMIZER_STATE})
    dist.barrier()
    return True


def load_sharded_checkpoint(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load checkpoints/last/ into the sharded model and optimizer (DCP reshards); return it for Run.load_state_dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    directory = Path(directory)
    rest = torch.load(directory / SHARDED_REST, map_location="cpu", weights_only=True)  # config, position, RNG, ...
    weights, optimizer_state = get_state_dict(model, optimizer)  # the shapes to fill (it creates the state)
    dcp.load({"model": weights, "optimizer": optimizer_state}, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optimizer_state)
    return {**rest, "model": model.state_dict(), "optimizer": optimizer.state_dict()}


def load_full_weights(model: nn.Module, weights: dict) -> None:
    """Full weights (best.pt's, on rank 0; other ranks pass {}) into the sharded model on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
