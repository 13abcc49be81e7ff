"""Atomic, self-contained checkpoints that load with torch.load(weights_only=True), and the bare
model inside DDP / torch.compile whose state dict they hold. RNG snapshots: trainkit.rng."""
import os
import shutil
from pathlib import Path

import torch


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP (`.module`) and torch.compile (`._orig_mod`), so state-dict keys
    carry no `module.` or `_orig_mod.` prefixes and load into a plain model."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def save_checkpoint(path: Path, state: dict) -> None:
    """Write to a temporary file, then rename: a crash mid-write never leaves a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def copy_checkpoint(source: Path, destination: Path) -> None:
    """Copy a saved checkpoint (e.g. last.pt to best.pt), atomically, without serializing it again."""
    tmp = destination.with_name(destination.name + ".tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, destination)


def load_checkpoint(path: str | Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=True)
