"""Train an image classifier: the whole story of one run, top to bottom.

    python train.py                       # digits + small CNN: seconds on a laptop CPU
    python train.py --help                # config groups and every option
    python train.py model=timm optimizer=adamw optimizer.lr=1e-3

Hydra composes the config from conf/; the pieces this file calls live in src/trainkit/.
"""
import json
import logging
import math
import sys
import time
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from trainkit import cli
from trainkit.augment import BatchTransform
from trainkit.batch_size_finder import find_batch_size_for_run
from trainkit.checkpoint import copy_checkpoint, load_checkpoint, save_checkpoint, unwrap_model
from trainkit.config import validate
from trainkit.console import print_config
from trainkit.data import build_data
from trainkit.distributed import (ProcessInfo, all_reduce_sum, any_rank, average_batchnorm_statistics, broadcast_weights,
                                  destroy_process_group, gather_objects, gradient_sync, init_process_group,
                                  launched_externally, process_info)
from trainkit.early_stopping import EarlyStopping
from trainkit.errors import ConfigError
from trainkit.images import augmented_samples, save_png
from trainkit.known_noise import quiet_known_warnings
from trainkit.launch import configure_worker_logging, launch_local_workers, limit_cpu_threads, processes_per_node
from trainkit.loggers import build_loggers, wandb_names
from trainkit.lr_finder import lr_range_test_for_run, set_base_lr
from trainkit.finetune import apply_frozen_bn_eval
from trainkit.models import build_model
from trainkit.optim import build_optimizer, build_scheduler
from trainkit.rng import restore_rng_states, rng_states
from trainkit.runtime import autocast, grad_scaler, pick_device, seed_everything
from trainkit.sweeps import run_trial

log = logging.getLogger("train")
quiet_known_warnings()  # known, harmless optuna/SQLAlchemy/plugin chatter; real warnings still show


def evaluate(model, loader, transform, precision, device, limit=None) -> dict:
    """Plain cross-entropy and accuracy over each sample exactly once: sums and counts are
    all-reduced across ranks before dividing, never per-rank means."""
    model.eval()
    totals = torch.zeros(3, device=device)  # loss sum, correct, count
    with torch.no_grad():
        for i, (images, labels) in enumerate(loader):
            if limit is not None and i >= limit:
                break
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with autocast(precision, device):
                logits = model(transform(images))
            totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
            totals[1] += (logits.argmax(dim=1) == labels).sum()
            totals[2] += labels.numel()
    loss_sum, correct, count = all_reduce_sum(totals).tolist()
    return {"loss": loss_sum / max(count, 1), "acc": correct / max(count, 1), "samples": int(count)}


def train_one_epoch(model, loader, transform, loss_fn, optimizer, scheduler, scaler, cfg, device, epoch, step, loggers,
                    show_progress, start_batch=0, save_progress=None):
    """One pass over the training data, from `start_batch` when a run resumes mid-epoch.
    Returns (metrics, global update count, batches of the epoch done)."""
    model.train()
    apply_frozen_bn_eval(model)  # BatchNorm inside frozen layers keeps its statistics
    trainer = cfg.trainer
    accumulate = trainer.accumulate_grad_batches
    num_batches = min(len(loader), trainer.limit_train_batches or len(loader))
    totals = torch.zeros(3, device=device)  # loss sum, correct, count: stay on the device until logged
    interval_loss, interval_batches = torch.zeros((), device=device), 0
    progress = tqdm(total=num_batches, initial=start_batch, desc=f"epoch {epoch}", leave=False, dynamic_ncols=True,
                    disable=not show_progress)
    started, batches_done = time.perf_counter(), start_batch
    for i, (images, labels) in enumerate(loader, start=start_batch):
        if i >= num_batches or (trainer.max_steps and step >= trainer.max_steps):
            break
        # Micro-batches of one update form a group; the last group of the epoch may be short,
        # so the loss is divided by the real group size, not by accumulate_grad_batches.
        group_start = i - i % accumulate
        group_size = min(accumulate, num_batches - group_start)
        is_update = i - group_start == group_size - 1
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with gradient_sync(model, enabled=is_update), autocast(cfg.precision.name, device):
            logits = model(transform(images))
            loss = loss_fn(logits.float(), labels)
            scaler.scale(loss / group_size).backward()
        if is_update:
            if trainer.grad_clip:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
        batch_loss = loss.detach()
        totals[0] += batch_loss * labels.numel()
        totals[1] += (logits.detach().argmax(dim=1) == labels).sum()
        totals[2] += labels.numel()
        interval_loss += batch_loss
        interval_batches += 1
        batches_done = i + 1
        if is_update and step % trainer.log_every_n_steps == 0:
            step_loss = all_reduce_sum(torch.stack([interval_loss, torch.tensor(float(interval_batches), device=device)]))
            if loggers:
                loggers.log({"epoch": epoch, "step": step, "train/step_loss": (step_loss[0] / step_loss[1]).item(),
                             "lr": optimizer.param_groups[0]["lr"]})
            interval_loss.zero_()
            interval_batches = 0
        every = trainer.checkpoint_every_n_steps
        if save_progress and is_update and every and step % every == 0 and batches_done < num_batches:
            save_progress(epoch, step, batches_done)  # mid-epoch: a long epoch survives preemption
        progress.update()
        if show_progress and (i % 10 == 0 or i == num_batches - 1):
            progress.set_postfix(loss=f"{batch_loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
    progress.close()
    loss_sum, correct, count = all_reduce_sum(totals).tolist()
    seconds = time.perf_counter() - started
    return {"train/loss": loss_sum / max(count, 1), "train/acc": correct / max(count, 1),
            "train/samples_per_sec": count / seconds, "lr": optimizer.param_groups[0]["lr"]}, step, batches_done


def train(cfg: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> dict:
    """One process's part of the run: the only process, or one rank of many. Returns the summary."""
    started = time.perf_counter()
    # Each rank draws its own augmentation and dropout; DDP makes the initial weights agree.
    seed_everything(cfg.seed + proc.rank)

    data = build_data(cfg.data, device=device, seed=cfg.seed, rank=proc.rank, world_size=proc.world_size)
    if cfg.data.num_classes is None:  # an image folder counts its classes; the model reads this key
        cfg.data.num_classes = data.num_classes
    model, input_size = build_model(cfg.model, image_size=data.image_size)
    if cfg.distributed.sync_batchnorm and proc.world_size > 1:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    channels_last = cfg.trainer.channels_last
    model = model.to(device, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    # Scaling, resizing, augmentation and normalization run batched on the device.
    train_transform = BatchTransform(data.mean, data.std, input_size, cfg.augmentation,
                                     train=True, channels_last=channels_last).to(device)
    eval_transform = BatchTransform(data.mean, data.std, input_size, None, train=False, channels_last=channels_last).to(device)

    trainer = cfg.trainer
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.regularization.label_smoothing)
    if cfg.batch_size_finder.enabled and not cfg.resume:
        cfg.data.batch_size = find_batch_size_for_run(cfg.batch_size_finder, model, loss_fn, data.train, train_transform,
                                                      cfg.precision.name, device)
        log.info(f"batch size finder: data.batch_size={cfg.data.batch_size} per process")
        data = build_data(cfg.data, device=device, seed=cfg.seed, rank=proc.rank, world_size=proc.world_size)
    optimizer = build_optimizer(model, cfg.optimizer, batch_size=cfg.data.batch_size, world_size=proc.world_size,
                                accumulate=trainer.accumulate_grad_batches)
    batches_per_epoch = min(len(data.train), trainer.limit_train_batches or len(data.train))
    updates_per_epoch = math.ceil(batches_per_epoch / trainer.accumulate_grad_batches)
    total_updates = min(updates_per_epoch * trainer.max_epochs, trainer.max_steps or math.inf)
    scheduler = build_scheduler(optimizer, cfg.scheduler, updates_per_epoch, total_updates)
    scaler = grad_scaler(cfg.precision.name, device)
    early_stopping = EarlyStopping(**cfg.regularization.early_stopping)

    start_epoch, start_batch, step, best_metrics, wandb_run_id = 0, 0, 0, {}, None
    if cfg.resume:
        checkpoint = load_checkpoint(cfg.resume, device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        early_stopping.load_state_dict(checkpoint["early_stopping"])
        step, best_metrics, start_batch = checkpoint["step"], checkpoint["best_metrics"], checkpoint["batches_done"]
        start_epoch = checkpoint["epoch"] + (0 if start_batch else 1)  # mid-epoch: finish that epoch first
        wandb_run_id = checkpoint.get("wandb_run_id")  # the resumed run continues the same W&B run
        rng = checkpoint["rng"]
        if len(rng) == proc.world_size:
            restore_rng_states(rng[proc.rank])
        else:  # another world size: fresh, still distinct, streams per rank
            seed_everything(cfg.seed + proc.rank + 1000 * start_epoch)
        log.info(f"resumed from {cfg.resume} at epoch {start_epoch}, batch {start_batch}, step {step}")
    # Order matters: compile the model on its device, then wrap it for DDP (which broadcasts
    # rank 0's initial weights to every rank).
    trained_model = torch.compile(model) if trainer.compile else model
    if proc.world_size > 1:
        trained_model = DistributedDataParallel(trained_model, device_ids=[device.index] if device.type == "cuda" else None)

    resolved_config = OmegaConf.to_container(cfg, resolve=True)  # plain containers: loadable with weights_only=True
    checkpoints = run_dir / "checkpoints"

    def checkpoint_state(epoch: int, step: int, batches_done: int, rng: list) -> dict:
        """Everything a resume needs; batches_done > 0 marks a checkpoint from inside `epoch`."""
        return {"model": unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                "early_stopping": early_stopping.state_dict(), "best_metrics": best_metrics, "epoch": epoch, "step": step,
                "batches_done": batches_done, "rng": rng, "config": resolved_config,
                "wandb_run_id": loggers.run_id if loggers else None}

    def save_progress(epoch: int, step: int, batches_done: int) -> None:  # runs on every rank
        rng = gather_objects(rng_states())
        if proc.is_main:
            save_checkpoint(checkpoints / "last.pt", checkpoint_state(epoch, step, batches_done, rng))

    loggers = None  # rank 0 alone logs
    if proc.is_main:
        run_name, group = wandb_names(run_dir=run_dir)
        loggers = build_loggers(cfg.logger, run_dir, config=resolved_config,
                                run_name=run_name, group=group, resume_id=wandb_run_id)
        if cfg.logger.get("log_images", False):
            samples = augmented_samples(data.train, train_transform, data.mean, data.std, device)
            loggers.log_image("train/samples", save_png(samples, run_dir / "train_samples.png"), step)
    if cfg.lr_finder.enabled and not cfg.resume:  # every rank takes part; model and optimizer are restored after
        plot = run_dir / "lr_finder.png" if proc.is_main else None
        result = lr_range_test_for_run(cfg.lr_finder, trained_model, optimizer, scheduler, scaler, data.train, loss_fn,
                                       train_transform, trainer.grad_clip, cfg.precision.name, device, plot)
        if loggers:
            loggers.log_image("lr_finder", plot, step)
        if cfg.lr_finder.apply and result.suggestion:
            set_base_lr(optimizer, result.suggestion)  # each parameter group keeps its lr_scale
            scheduler = build_scheduler(optimizer, cfg.scheduler, updates_per_epoch, total_updates)
    show_progress = proc.is_main and trainer.progress_bar and sys.stderr.isatty()
    last_metrics, stop_reason = {}, "max_epochs"
    log.info(f"training {sum(p.numel() for p in model.parameters() if p.requires_grad):,} parameters on {device} "
             f"for {trainer.max_epochs} epochs ({updates_per_epoch} updates each) -> {run_dir}")
    failed = True  # until the run ends normally: the tracker then marks it finished, else failed
    try:
        for epoch in range(start_epoch, trainer.max_epochs):
            data.train.set_epoch(epoch, start_batch=start_batch)
            train_metrics, step, batches_done = train_one_epoch(
                trained_model, data.train, train_transform, loss_fn, optimizer, scheduler, scaler, cfg, device, epoch, step,
                loggers, show_progress, start_batch, save_progress)
            start_batch = 0
            unfinished = batches_done if batches_done < batches_per_epoch else 0  # a max_steps stop mid-epoch
            average_batchnorm_statistics(model)  # BatchNorm statistics from every rank's shard, before eval and save
            val = evaluate(trained_model, data.val, eval_transform, cfg.precision.name, device,
                           trainer.limit_val_batches)
            last_metrics = {"epoch": epoch, "step": step, **train_metrics, "val/loss": val["loss"], "val/acc": val["acc"]}
            improved = early_stopping.update(last_metrics[early_stopping.monitor], epoch)
            if improved:
                best_metrics = {"epoch": epoch, "step": step, "val/loss": val["loss"], "val/acc": val["acc"]}
            rng = gather_objects(rng_states())  # every rank's streams, so a resume restores each one
            if proc.is_main:
                loggers.log(last_metrics)
                log.info(f"epoch {epoch:>3}  train/loss {train_metrics['train/loss']:.4f}  val/loss {val['loss']:.4f}  "
                         f"val/acc {val['acc']:.4f}  lr {train_metrics['lr']:.2e}  "
                         f"{train_metrics['train/samples_per_sec']:,.0f} samples/s{'  *' if improved else ''}")
                save_checkpoint(checkpoints / "last.pt", checkpoint_state(epoch, step, unfinished, rng))
                if improved:
                    copy_checkpoint(checkpoints / "last.pt", checkpoints / "best.pt")
            # Every stop is decided by all ranks together, so no rank waits alone in a collective.
            if any_rank(not math.isfinite(train_metrics["train/loss"]), device):
                stop_reason = "non-finite loss"
                log.error(f"train/loss is not finite at epoch {epoch}: lower optimizer.lr or set trainer.grad_clip")
                break
            if any_rank(early_stopping.should_stop, device):
                stop_reason = "early_stopping"
                log.info(f"early stopping: {early_stopping.monitor} has not improved for {early_stopping.patience} epochs")
                break
            if trainer.max_steps and step >= trainer.max_steps:
                stop_reason = "max_steps"
                break

        # Test with the best weights: rank 0 reads best.pt and sends the weights to every rank, so
        # nodes need not share a file system.
        if proc.is_main and (checkpoints / "best.pt").exists():
            unwrap_model(model).load_state_dict(load_checkpoint(checkpoints / "best.pt", device)["model"])
        broadcast_weights(unwrap_model(model))
        test = evaluate(trained_model, data.test, eval_transform, cfg.precision.name, device)
        test_metrics = {"test/loss": test["loss"], "test/acc": test["acc"]}
        summary = {
            "best": best_metrics, "final": last_metrics, "test": test_metrics,
            "optimized_metric": cfg.optimized_metric,
            "optimized_value": {**best_metrics, **test_metrics}.get(cfg.optimized_metric),
            "stop_reason": stop_reason, "epochs": last_metrics.get("epoch", start_epoch - 1) + 1, "steps": step,
            "wall_seconds": time.perf_counter() - started, "world_size": proc.world_size,
            "device": str(device), "run_dir": str(run_dir.resolve()),
        }
        if proc.is_main:
            loggers.log({"epoch": summary["epochs"] - 1, "step": step, **test_metrics})
            best = {f"best/{key}": value for key, value in best_metrics.items()}
            loggers.summary({**best, **test_metrics, "stop_reason": stop_reason})
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            log.info(f"done in {summary['wall_seconds']:.1f}s: test/acc {test['acc']:.4f} "
                     f"(best val/acc {best_metrics.get('val/acc', float('nan')):.4f} at epoch {best_metrics.get('epoch')}) "
                     f"-> {run_dir}")
        failed = stop_reason == "non-finite loss"
    finally:
        if loggers:
            loggers.finish(failed=failed)
    return summary


def run(cfg: DictConfig, run_dir: Path) -> float:
    """Runs in every process: join the process group (if there is one), train, always leave it."""
    proc = process_info()
    device = pick_device(cfg.device, proc.local_rank)
    init_process_group(proc, device, cfg.distributed.backend, cfg.distributed.timeout_seconds)
    try:
        return train(cfg, run_dir, proc, device)["optimized_value"]
    finally:
        destroy_process_group()


def ddp_worker(config: dict, run_dir: str) -> float:
    """Entry point of each process train.py starts itself. Hydra ran once, in the parent, which
    hands over the composed config and its run directory."""
    proc = process_info()
    configure_worker_logging(Path(run_dir), proc)
    limit_cpu_threads(proc.local_world_size)
    try:
        return run(OmegaConf.create(config), Path(run_dir))
    except ConfigError as error:  # bad input found late (e.g. a data file): one line, from rank 0
        if proc.is_main:
            print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


def launch(cfg: DictConfig) -> float:
    """Check the config, then train here or in the DDP processes started for this run."""
    validate(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.print_config and process_info().is_main:
        print_config(cfg, run_dir)
    if cfg.distributed.name == "ddp" and not launched_externally():
        nproc = processes_per_node(cfg.distributed)
        log.info(f"launching {nproc} DDP processes -> {run_dir}")
        results = launch_local_workers(nproc, __file__, "ddp_worker", OmegaConf.to_container(cfg, resolve=True), str(run_dir))
        return results[0]
    return run(cfg, run_dir)


@hydra.main(version_base=None, config_path="conf", config_name="config")
@cli.report_config_errors
def main(cfg: DictConfig) -> float:
    # In a multirun, a crashing trial reports sweep.failed_trial_value and the sweep goes on.
    return run_trial(launch, cfg)


if __name__ == "__main__":
    cli.run(main)
