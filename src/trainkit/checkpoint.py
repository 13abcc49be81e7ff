"""Atomic, self-contained checkpoints that load with torch.load(weights_only=True)."""
import os
import random
import shutil
from pathlib import Path

import numpy as np
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


def rng_states() -> dict:
    """Every random stream a resumed run needs to continue exactly, as plain containers."""
    return {
        "python": list(random.getstate()[1]) + [random.getstate()[2]],
        "python_version": random.getstate()[0],
        "numpy": np.random.get_state()[1].tolist() + list(np.random.get_state()[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(state: dict) -> None:
    python = state["python"]
    random.setstate((state["python_version"], tuple(python[:-1]), python[-1]))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", np.array(numpy[:624], dtype=np.uint32), *numpy[624:]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
