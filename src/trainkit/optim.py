"""The optimizer over weight-decay (and backbone/head) groups, and the keys of conf/optimizer/*.yaml that are not its
own arguments: head_lr_scale, scale_lr_with_batch, reference_batch_size, fused (the yamls say what each does)."""

import fnmatch
import inspect
import logging
from collections.abc import Mapping

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch.optim.optimizer import _get_foreach_kernels_supported_devices, _get_fused_kernels_supported_devices

from trainkit.checkpointing.checkpoint import unwrap_model
from trainkit.config.schema import to_dict
from trainkit.distributed.process_group import process_info
from trainkit.errors import ConfigError
from trainkit.models.submodules import head_parameters

log = logging.getLogger(__name__)


def param_groups(
    model: torch.nn.Module, weight_decay: float, head_lr_scale: float = 1.0, lr: float | None = None
) -> list[dict]:
    """Parameter groups, decayed and not, split into backbone and head where `head_lr_scale != 1`, frozen parameters
    left out. Not decayed: ndim <= 1 (biases, norms) and what the model's `no_weight_decay()` names (timm's names or
    fnmatch patterns). Each carries `lr_scale` (and `lr * lr_scale` where `lr` is given), in a fixed order, backbone
    first, even when empty: `param_groups[0]["lr"]` is the base LR and a checkpoint always has the same groups."""
    model = unwrap_model(model)  # names as the model itself gives them in no_weight_decay()
    head = set()
    if head_lr_scale != 1.0:
        head = {id(p) for p in head_parameters(model)}
        if not head:
            raise ConfigError(
                "optimizer.head_lr_scale",
                f"found no classifier head in {type(model).__name__}; set optimizer.head_lr_scale=1",
            )
    named = getattr(model, "no_weight_decay", None)
    patterns = set(named()) if callable(named) else set()
    undecayed = {
        id(p)
        for name, p in model.named_parameters()
        if p.ndim <= 1 or any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    }
    parts = [(False, 1.0)] + ([(True, head_lr_scale)] if head_lr_scale != 1.0 else [])  # (in the head, LR scale)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = []
    for in_head, scale in parts:
        for decayed in (True, False):
            params = [p for p in trainable if (id(p) in head) == in_head and (id(p) not in undecayed) == decayed]
            group = {"params": params, "weight_decay": weight_decay if decayed else 0.0, "lr_scale": scale}
            if lr is not None:
                group["lr"] = lr * scale
            groups.append(group)
    return groups


def scaled_lr(base_lr: float, batch_size: int, world_size: int = 1, accumulate: int = 1, reference: int = 256) -> float:
    """The linear scaling rule (Goyal et al., 2017): base_lr * global batch (batch_size per process x world_size x
    accumulate) / reference. It holds for SGD up to global batches of a few thousand, with a warmup; for Adam(W)
    square-root scaling is often closer: turn the flag off and set optimizer.lr yourself."""
    sizes = {"batch_size": batch_size, "world_size": world_size, "accumulate": accumulate, "reference": reference}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"scaled_lr: {name} must be a positive integer, got {value!r}")
    return base_lr * batch_size * world_size * accumulate / reference


def build_optimizer(
    model: torch.nn.Module, cfg: Mapping, *, batch_size: int | None = None, world_size: int = 1, accumulate: int = 1
) -> torch.optim.Optimizer:
    """The `_target_` optimizer over `param_groups`. `batch_size` (per process), `world_size` and `accumulate` are
    needed only with `scale_lr_with_batch: true` (`scaled_lr`)."""
    options = to_dict(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    head_lr_scale = options.pop("head_lr_scale", 1.0)
    scale_with_batch = options.pop("scale_lr_with_batch", False)
    reference = options.pop("reference_batch_size", 256)
    fused = options.pop("fused", "auto")
    options.pop("_checks_", None)  # the module that checks the option's keys (optimizer=muon)
    if scale_with_batch:
        if batch_size is None:
            raise ValueError(
                "build_optimizer: optimizer.scale_lr_with_batch=true needs batch_size (and world_size, accumulate)"
            )
        lr = scaled_lr(options["lr"], batch_size, world_size, accumulate, reference)
        log.info(
            f"optimizer.lr {options['lr']:g} scaled to {lr:g} for a global batch of "
            f"{batch_size * world_size * accumulate} (reference {reference})"
        )
        options["lr"] = lr
    groups = param_groups(model, options.get("weight_decay", 0.0), float(head_lr_scale), lr=options["lr"])
    device = next(model.parameters()).device
    optimizer_class = get_class(options["_target_"])
    options.update(implementation_options(fused, optimizer_class, device))
    if "model" in inspect.signature(optimizer_class).parameters:  # one that splits the model (optimizer=muon)
        options["model"] = unwrap_model(model)
    optimizer = instantiate(options, params=groups, _convert_="all")
    if process_info().is_main:
        setting = f"optimizer.fused={str(fused).lower()}"  # as typed: auto, true, false
        split = f": {optimizer.split()}" if callable(getattr(optimizer, "split", None)) else ""
        log.info(f"optimizer: {optimizer_class.__name__}, {implementation(optimizer, device)} ({setting}){split}")
    return optimizer


def implementation_options(fused: str | bool, optimizer_class: type, device: torch.device) -> dict[str, bool]:
    """`optimizer.fused`: `auto` takes the fused kernel on CUDA where the optimizer has one, else torch's default;
    `true` asks for it on any device (refused where there is none); `false`: torch's default."""
    has_fused = "fused" in inspect.signature(optimizer_class).parameters
    if fused is True and (not has_fused or device.type not in _get_fused_kernels_supported_devices()):
        where = "at all" if not has_fused else f"on {device.type}"
        raise ConfigError(
            "optimizer.fused",
            f"is true, but {optimizer_class.__name__} has no fused implementation {where}; "
            f"use optimizer.fused=auto or false",
        )
    wanted = fused is True or (fused == "auto" and has_fused and device.type == "cuda")
    return {"fused": True} if wanted else {}


def implementation(optimizer: torch.optim.Optimizer, device: torch.device) -> str:
    """Which implementation `optimizer` runs: fused, foreach or a per-parameter for-loop."""
    if optimizer.defaults.get("fused"):
        return "fused"
    foreach = optimizer.defaults.get("foreach")
    if foreach or (foreach is None and device.type in _get_foreach_kernels_supported_devices()):
        return "foreach"
    return "for-loop"
