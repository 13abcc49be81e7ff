"""What train.py reports about a run: the start line, each epoch's line, and once tested summary.json
(strict JSON; its keys: README's "The run directory"), the trackers' summary and the closing line. summary.json is what
a sweep, scripts/compare_runs.py and `resume` of a finished run read."""

import logging
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.tasks.task import higher_is_better
from trainkit.tracking.bottleneck import epoch_line_extras  # feature: loop_timing
from trainkit.tracking.loggers import strict_json

log = logging.getLogger("train")  # train.py's logger: these are its lines


def training_line(
    model: torch.nn.Module,
    trainer: DictConfig,
    updates_per_epoch: int,
    device: torch.device,
    run_dir: object,
    code: str | None = None,
    batch_size: int | None = None,
    longest: int | None = None,
    unit: str | None = "tokens",
    task: Any = None,
    world_size: int = 1,
    fold: str | None = None,
) -> str:
    """`training N parameters on DEVICE for LENGTH[, MICRO-BATCHES][, COUPLED][, val fold i of K] (code a1b2c3d+dirty)
    -> RUN_DIR`. `batch_size` (data.batch_size), `longest` (sized data's longest training item, in `unit`s) and `task`
    say how a batch is split and coupled; `fold`: data.folds' "fold i of K", None without folds."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    length = f"{trainer.max_epochs} epochs ({updates_per_epoch} updates each)"
    if trainer.max_epochs == 1:
        length = f"1 epoch ({updates_per_epoch} updates)"
    if trainer.max_steps and trainer.max_steps < updates_per_epoch * trainer.max_epochs:
        length = f"{trainer.max_steps} updates (trainer.max_steps; {updates_per_epoch} updates an epoch)"
    micro = trainer.get("micro_batch_size")
    if isinstance(micro, int) and batch_size is not None:
        length += micro_batches_part(micro, batch_size, longest, model, unit or "tokens")
    if batch_size is not None:
        length += coupled_batch_part(task, world_size, batch_size)
    if fold:
        length += f", val {fold} (data.folds)"
    code_part = f" (code {code})" if code else ""
    notes = [note for module in model.modules() if isinstance(note := getattr(module, "dropout_note", None), str)]
    note_part = f" ({notes[0]})" if notes else ""  # a model=hf model's dropout, from its library config
    return f"training {trainable:,} parameters{note_part} on {device} for {length}{code_part} -> {run_dir}"


def micro_batches_part(micro: int, batch_size: int, longest: int | None, model: nn.Module, unit: str = "tokens") -> str:
    """What trainer.micro_batch_size=`micro` does to a batch, for the start line ("" where it splits none). Sized data
    (`longest` given) counts units: a part holds micro // the batch's padded length whole sequences, at least one."""
    if longest is None:
        if micro >= batch_size:
            return ""
        batchnorm = any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in model.modules())
        normalizes = f" (BatchNorm normalizes over {micro} samples, not {batch_size})" if batchnorm else ""
        return f", each batch of {batch_size} in micro-batches of {micro}{normalizes}"
    if micro // longest >= batch_size:  # even a batch of the longest sequences is one part
        return ""
    if micro < longest:
        log.warning(
            f"trainer.micro_batch_size={micro} counts {unit} on this data and is below one sequence: a part holds "
            f"at least one whole sequence, so a batch of sequences longer than {micro} {unit} trains one a part (up "
            f"to {longest} {unit} each, {batch_size} forward passes a full batch); the smallest size parts keep to is "
            f"{longest} (the longest sequence): trainer.micro_batch_size={longest} or more"
        )
    held = max(1, micro // longest)
    return (
        f", each batch of up to {batch_size} sequences in micro-batches of {micro} {unit} (a part holds {micro} // "
        f"the batch's padded length sequences, at least 1: {held} of the longest, {longest} {unit})"
    )


def coupled_batch_part(task: Any, world_size: int, batch_size: int) -> str:
    """For the start line under several processes, a task whose loss couples a batch's samples (Task.couples_batch,
    a contrastive loss's negatives): whether it couples each rank's batch alone or, gathered, every rank's."""
    if world_size == 1 or not getattr(task, "couples_batch", False):
        return ""
    if getattr(task, "gathers_across_ranks", False):
        return f", the loss couples all {world_size} ranks' batches of {batch_size} (gathered across ranks)"
    return (
        f", the loss couples each rank's batch of {batch_size} alone, not all {world_size * batch_size} samples of "
        f"the {world_size} ranks (per rank: gather them in the task's step, docs/recipes.md)"
    )


def epoch_line(epoch: int, train_metrics: dict, val: dict, improved: bool) -> str:
    """`epoch N  train/loss ..  val/loss ..  val/<metric> ..  lr ..  N samples/s`, where the time went and `*` where
    the monitored metric improved."""
    val_metrics = "".join(f"  val/{name} {value:.4f}" for name, value in val.items() if name != "samples")
    line = f"epoch {epoch:>3}  train/loss {train_metrics['train/loss']:.4f}{val_metrics}  lr {train_metrics['lr']:.2e}"
    line += f"  {throughput(train_metrics)}"
    line += epoch_line_extras(train_metrics)  # feature: loop_timing
    return line + ("  *" if improved else "")


def throughput(train_metrics: dict) -> str:
    """`N samples/s`; data whose items have sizes `N <unit>/s` (tokens/s, frames/s)."""
    rates = [key for key in train_metrics if key.endswith("_per_sec") and key != "train/samples_per_sec"]
    if not rates:
        return f"{train_metrics['train/samples_per_sec']:,.0f} samples/s"
    unit = rates[0].removeprefix("train/").removesuffix("_per_sec")
    line = f"{train_metrics[rates[0]]:,.0f} {unit}/s"
    line += f"  mfu {train_metrics['train/mfu']:.1%}" if "train/mfu" in train_metrics else ""  # feature: mfu
    return line


def write_summary(
    run: Any, last_metrics: dict, test_metrics: dict, stop_reason: str, wall_seconds: float, test_weights: str = "best"
) -> dict:
    """summary.json of `Run` (trainkit/run.py), which every rank builds and rank 0 alone writes and logs; the test
    metrics as the run's last metrics line; the trackers' summary."""
    best = run.state.best_metrics
    samplers = {name: getattr(getattr(run.data, name, None), "sampler", None) for name in ("train", "val")}
    summary = {
        "best": best,
        "final": last_metrics,
        "test": test_metrics,
        "test_weights": test_weights,
        "optimized_metric": run.cfg.optimized_metric,
        "optimized_value": {**best, **test_metrics}.get(run.cfg.optimized_metric),
        "higher_is_better": {name: higher_is_better(run.task, name) for name in ("loss", *run.task.metric_names)},
        "metric_ranges": {name: list(bounds) for name, bounds in getattr(run.task, "metric_ranges", {}).items()},
        "split_sizes": {name: getattr(sampler, "size", None) for name, sampler in samplers.items()},  # every rank's
        "stop_reason": stop_reason,
        "epochs": last_metrics.get("epoch", run.state.epoch - 1) + 1,
        "steps": run.state.step,
        "wall_seconds": wall_seconds,
        "world_size": run.proc.world_size,
        "device": str(run.device),
        "run_dir": str(run.run_dir.resolve()),
        **({"fold": run.data.fingerprint["fold"]} if run.data.fingerprint.get("fold") else {}),  # "fold 2 of 5"
        "data": run.data.fingerprint.get("identity"),  # what it read before any split (trainkit.data.fingerprint)
    }
    run.loggers.log({"epoch": summary["epochs"] - 1, "step": run.state.step, **test_metrics})
    run.loggers.summary(
        {**{f"best/{key}": value for key, value in best.items()}, **test_metrics, "stop_reason": stop_reason}
    )
    if run.proc.is_main:
        (run.run_dir / "summary.json").write_text(strict_json(summary, indent=2))  # NaN -> null
        name = run.task.metric_names[0] if run.task.metric_names else "loss"  # the task's headline metric
        test = test_metrics[f"test/{name}"]
        log.info(f"done in {wall_seconds:.1f}s: test/{name} {test:.4f} ({best_epoch_part(run, best)}) -> {run.run_dir}")
    return summary


def best_epoch_part(run: Any, best: dict) -> str:
    """`best epoch 3 by the monitored val/loss 0.1523; val/acc 0.9944 then`: the epoch best.pt holds, chosen by the
    monitored metric (regularization.early_stopping.monitor), and the other val/ metrics of that epoch."""
    monitor = getattr(getattr(run, "early_stopping", None), "monitor", None)
    if "epoch" not in best or monitor not in best:
        return "the last weights: no epoch was validated"
    others = ", ".join(f"{key} {value:.4f}" for key, value in best.items() if key.startswith("val/") and key != monitor)
    then = f"; {others} then" if others else ""
    return f"best epoch {best['epoch']} by the monitored {monitor} {best[monitor]:.4f}{then}"


def log_epoch_notes(run: Any, mid_epoch_saves: int, compile_seconds: float | None) -> None:
    """Rank 0, after train.py's epoch: its mid-epoch checkpoints, and torch.compile's time (compile + first step)."""
    if not run.proc.is_main:
        return
    if mid_epoch_saves:
        every = run.cfg.trainer.checkpoint_every_n_steps
        log.info(
            f"epoch {run.state.epoch:>3}  {mid_epoch_saves} mid-epoch checkpoints "
            f"(every {every} updates) -> checkpoints/{run.parallel.last}"
        )
    if compile_seconds is not None:
        log.info(f"compile + first step: {compile_seconds:.1f}s (left out of train/samples_per_sec)")
