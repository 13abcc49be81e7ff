"""Atomic, format-versioned checkpoints of `Run.state_dict()` (trainkit/run.py), loaded with weights_only=True, and
the parts of a resume beyond a load_state_dict: weights that must fit, new optimizer settings, an average."""

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf
from torch.optim.swa_utils import AveragedModel

from trainkit.checkpointing.files import (
    CHECKPOINT_FORMAT,
    check_model_fits,
    is_sharded_checkpoint,
    load_optimizer_state,
)
from trainkit.config.schema import to_dict
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP (`.module`) and torch.compile (`._orig_mod`): its state dict loads in a plain model."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = cast(torch.nn.Module, model._orig_mod)
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def save_checkpoint(path: Path, state: dict) -> None:
    """`state` with the format version, written to a temporary file, then renamed: a crash never leaves it torn."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:  # a file object: a failed write raises OSError with its errno
            torch.save({"format": CHECKPOINT_FORMAT, **state}, f)

    _write_atomically(path, write)


def copy_checkpoint(source: Path, destination: Path) -> None:
    """Copy a saved checkpoint (e.g. last.pt to best.pt), atomically, without serializing it again."""
    _write_atomically(destination, lambda tmp: shutil.copyfile(source, tmp))


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(<path>.tmp)`, renamed over `path`; on failure `path` stays, the torn file goes, a full disk: one line."""
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
    """Delete what a kill during a save left (never read: its rename had not happened): `*.tmp` files and folders, a
    last.old/ beside a complete sharded last/; returns their names."""
    stale = sorted(checkpoint_dir.glob("*.tmp")) if checkpoint_dir.is_dir() else []
    if is_sharded_checkpoint(checkpoint_dir / "last") and (checkpoint_dir / "last.old").is_dir():
        stale.append(checkpoint_dir / "last.old")
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [path.name for path in stale]


def load_checkpoint(path: str | Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=True)


def load_weights(model: torch.nn.Module, weights: dict) -> None:
    """A checkpoint's weights into the bare model, after a one-line check that they fit it."""
    check_model_fits(weights, model)
    model.load_state_dict(weights)


def restore_averaged(averaged: AveragedModel | None, state: dict) -> None:
    """A checkpoint's average of the weights (`averaged`: Run.averaged's, a feature's) back in place. Without one (the
    feature switched on since) the average starts from its weights; one this run keeps none of is not used."""
    saved = state.get("averaged")
    if averaged is None:
        if saved is not None:
            log.info("the checkpoint's averaged weights are not used: no feature averages the weights in this run")
    elif saved is None:
        log.info("the checkpoint has no averaged weights: the average starts from its weights")
        averaged.module.load_state_dict(state["model"])
        averaged.n_averaged.zero_()
    else:
        averaged.load_state_dict(saved)


def averaged_weights(state: dict) -> dict:
    """The bare model's state dict inside a checkpoint's `averaged` entry (AveragedModel's: `module.<name>` and its
    count), to load into a plain model: `model.load_state_dict(averaged_weights(checkpoint["averaged"]))`."""
    return {key.removeprefix("module."): value for key, value in state.items() if key.startswith("module.")}


def restore_optimizer_and_schedule(
    optimizer: torch.optim.Optimizer, scheduler: Any, state: dict, cfg: DictConfig
) -> None:
    """The optimizer's state and the schedule's position from a checkpoint. Where this run's optimizer settings differ
    (an override, or the batch size an LR scales with), the config's replace the saved ones."""
    configured = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    load_optimizer_state(optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    saved = OmegaConf.create(state["config"])
    batch_keys = ("data.batch_size", "trainer.accumulate_grad_batches")
    rescaled = OmegaConf.select(cfg, "optimizer.scale_lr_with_batch", default=False) and any(
        OmegaConf.select(saved, key) != OmegaConf.select(cfg, key) for key in batch_keys
    )
    if rescaled or state["config"].get("optimizer") != (to_dict(cfg.optimizer) if "optimizer" in cfg else None):
        for group, settings in zip(optimizer.param_groups, configured):
            group.update(settings)
        scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    # The schedule is a function of the update count built from the config (trainer.max_epochs, scheduler.*).
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
