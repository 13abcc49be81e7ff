"""Optimizer with weight-decay groups, and learning-rate schedules counted in optimizer updates."""
import math

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from trainkit.errors import ConfigError

SCHEDULES = ("cosine", "cosine_restarts", "step", "constant")


def param_groups_for_weight_decay(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay the weights of convolutions and linear layers only.

    Biases and normalization scales/shifts (every parameter with ndim <= 1) are left undecayed:
    shrinking them toward zero only hurts. Frozen parameters are left out entirely.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: torch.nn.Module, cfg: DictConfig) -> torch.optim.Optimizer:
    groups = param_groups_for_weight_decay(model, cfg.weight_decay)
    return instantiate(cfg, params=groups, _convert_="all")


class LRSchedule:
    """The LR multiplier as a pure function of the update count, so a resume lands exactly.

    Every length is given in epochs in the config and converted here to optimizer updates.
    """

    def __init__(self, cfg: DictConfig, updates_per_epoch: int, total_updates: int):
        if cfg.name not in SCHEDULES:
            raise ConfigError("scheduler.name", f"unknown schedule '{cfg.name}'; choose one of {', '.join(SCHEDULES)}")
        self.name = cfg.name
        self.warmup = round(cfg.get("warmup_epochs", 0) * updates_per_epoch)
        self.total = max(total_updates, self.warmup + 1)
        self.min_ratio = cfg.get("min_lr_ratio", 0.0)
        self.cycle = max(1, round(cfg.get("cycle_epochs", 1) * updates_per_epoch))
        self.cycle_mult = cfg.get("cycle_mult", 1)
        self.step_length = max(1, round(cfg.get("step_epochs", 1) * updates_per_epoch))
        self.gamma = cfg.get("gamma", 1.0)

    def _cosine(self, position: float, length: float) -> float:
        progress = min(position / length, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def __call__(self, update: int) -> float:
        if update < self.warmup:
            return (update + 1) / self.warmup
        since_warmup = update - self.warmup
        if self.name == "cosine":
            return self._cosine(since_warmup, self.total - self.warmup)
        if self.name == "cosine_restarts":
            length = self.cycle
            while since_warmup >= length:
                since_warmup -= length
                length *= self.cycle_mult
            return self._cosine(since_warmup, length)
        if self.name == "step":
            return self.gamma ** (since_warmup // self.step_length)
        return 1.0


def build_scheduler(optimizer, cfg: DictConfig, updates_per_epoch: int, total_updates: int):
    """A LambdaLR to be stepped once per optimizer update (not per micro-batch, not per epoch).

    The multiplier goes in as a plain function, which LambdaLR leaves out of its state dict: a
    checkpoint keeps only the update count, and a resumed run rebuilds the schedule from its config.
    """
    schedule = LRSchedule(cfg, updates_per_epoch, total_updates)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: schedule(update))
