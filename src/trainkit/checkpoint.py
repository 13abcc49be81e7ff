"""Atomic, self-contained checkpoints that load with torch.load(weights_only=True), and the bare
model inside DDP / torch.compile whose state dict they hold. RNG snapshots: trainkit.rng."""

import os
import shutil
from pathlib import Path
from typing import Any, cast

import torch


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP (`.module`) and torch.compile (`._orig_mod`), so state-dict keys
    carry no `module.` or `_orig_mod.` prefixes and load into a plain model."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = cast(torch.nn.Module, model._orig_mod)
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


def training_state(run: Any, batches_done: int, rng: list) -> dict[str, Any]:
    """Everything a resume needs from train.py's `Run`, as plain containers. `batches_done` > 0
    marks a checkpoint from inside `run.epoch` (a resume finishes that epoch first); `rng` holds
    every rank's RNG streams, in rank order."""
    from trainkit.schema import to_dict

    return {
        "model": unwrap_model(run.model).state_dict(),
        "ema": None if run.ema is None else run.ema.state_dict(),  # AveragedModel's: module.<name>, n_averaged
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "early_stopping": run.early_stopping.state_dict(),
        "best_metrics": run.best_metrics,
        "epoch": run.epoch,
        "step": run.step,
        "batches_done": batches_done,
        "rng": rng,
        "config": to_dict(run.cfg),
        "wandb_run_id": run.loggers.run_id,
    }


def restore_training_state(run: Any, state: dict) -> None:
    """Put a `training_state` back into train.py's `Run`: weights and their EMA, optimizer, schedule,
    scaler, early stopping, the position (the next epoch, or the rest of an unfinished one), the W&B
    run id, and this rank's RNG streams (fresh, still distinct ones when the number of ranks changed)."""
    from trainkit.ema import restore_ema
    from trainkit.rng import restore_rng_states
    from trainkit.runtime import seed_everything

    run.model.load_state_dict(state["model"])
    restore_ema(run.ema, state)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    run.early_stopping.load_state_dict(state["early_stopping"])
    run.step, run.best_metrics, run.batches_done = state["step"], state["best_metrics"], state["batches_done"]
    run.epoch = state["epoch"] + (0 if run.batches_done else 1)
    run.wandb_run_id = state.get("wandb_run_id")
    if len(state["rng"]) == run.proc.world_size:
        restore_rng_states(state["rng"][run.proc.rank])
    else:
        seed_everything(run.cfg.seed + run.proc.rank + 1000 * run.epoch)
