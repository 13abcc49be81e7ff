"""Atomic, self-contained checkpoints that load with torch.load(weights_only=True), and the bare
model inside DDP / torch.compile whose state dict they hold. RNG snapshots: trainkit.checkpointing.rng."""

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import OmegaConf

from trainkit.checkpointing.files import CHECKPOINT_FORMAT, check_model_fits, load_optimizer_state
from trainkit.errors import ConfigError


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

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:  # a file object: a failed write raises OSError with its errno
            torch.save(state, f)

    _write_atomically(path, write)


def copy_checkpoint(source: Path, destination: Path) -> None:
    """Copy a saved checkpoint (e.g. last.pt to best.pt), atomically, without serializing it again."""
    _write_atomically(destination, lambda tmp: shutil.copyfile(source, tmp))


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(<path>.tmp)`, then rename it over `path`. On failure the torn temporary file goes and
    `path` keeps its previous version; a full disk is said in one line, with the free space."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free = shutil.disk_usage(path.parent).free / 2**20
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise ConfigError(
            str(path), f"no space left on the device ({free:,.1f} MiB free); {kept}; free space, then resume this run"
        ) from error


def remove_stale_temporary_files(checkpoint_dir: Path) -> list[str]:
    """Delete `*.tmp` files a kill during a save left behind (never read: the rename had not
    happened); returns their names."""
    stale = sorted(checkpoint_dir.glob("*.tmp")) if checkpoint_dir.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return [path.name for path in stale]


def load_checkpoint(path: str | Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=True)


def training_state(run: Any, batches_done: int, rng: list) -> dict[str, Any]:
    """Everything a resume needs from train.py's `Run`, as plain containers. `batches_done` > 0
    marks a checkpoint from inside `run.epoch` (a resume finishes that epoch first); `rng` holds
    every rank's RNG streams, in rank order. `run.resolved_config`: the run's config as plain
    containers, resolved once (resolving it at every save cost more than writing the weights)."""
    return {
        "format": CHECKPOINT_FORMAT,
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
        "config": run.resolved_config,
        "wandb_run_id": run.loggers.run_id,
    }


def optimization_changed(run: Any, state: dict) -> bool:
    """Whether this run's optimizer settings differ from the checkpoint's (an override on resume),
    so the param groups take the config's values rather than the saved ones."""
    from trainkit.config.schema import to_dict

    saved, now = state["config"], run.cfg
    if saved.get("optimizer") != (to_dict(now.optimizer) if "optimizer" in now else None):
        return True
    scaled = OmegaConf.select(now, "optimizer.scale_lr_with_batch", default=False)
    batch_keys = ("data.batch_size", "trainer.accumulate_grad_batches")
    return bool(scaled) and any(
        OmegaConf.select(OmegaConf.create(saved), k) != OmegaConf.select(now, k) for k in batch_keys
    )


def restore_training_state(run: Any, state: dict) -> None:
    """Put a `training_state` back into train.py's `Run`: weights and their EMA, optimizer, schedule,
    scaler, early stopping, the position (the next epoch, or the rest of an unfinished one), the W&B
    run id, and this rank's RNG streams (fresh, still distinct ones when the number of ranks changed)."""
    from trainkit.checkpointing.rng import restore_rng_states
    from trainkit.models.ema import restore_ema
    from trainkit.runtime import seed_everything

    check_model_fits(state["model"], run.model)
    run.model.load_state_dict(state["model"])
    restore_ema(run.ema, state)
    configured = [{k: v for k, v in group.items() if k != "params"} for group in run.optimizer.param_groups]
    load_optimizer_state(run.optimizer, state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if optimization_changed(run, state):  # the config's hyperparameters replace the saved ones
        for group, settings in zip(run.optimizer.param_groups, configured):
            group.update(settings)
        run.scheduler.base_lrs = [group["initial_lr"] for group in run.optimizer.param_groups]
    # The schedule is a function of the update count built from the config (trainer.max_epochs, scheduler.*):
    # the next update's LR comes from it, not from the saved one.
    for group, base_lr, factor in zip(run.optimizer.param_groups, run.scheduler.base_lrs, run.scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(run.scheduler.last_epoch)
    run.scaler.load_state_dict(state["scaler"])
    run.early_stopping.load_state_dict(state["early_stopping"])
    run.step, run.best_metrics, run.batches_done = state["step"], state["best_metrics"], state["batches_done"]
    run.epoch = state["epoch"] + (0 if run.batches_done else 1)
    run.wandb_run_id = state.get("wandb_run_id")
    if len(state["rng"]) == run.proc.world_size:
        restore_rng_states(state["rng"][run.proc.rank])
    else:
        seed_everything(run.cfg.seed + run.proc.rank + 1000 * run.epoch)
