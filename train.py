"""Train a model: the whole story of one run, top to bottom.

    python train.py                       # digits + small CNN: seconds on a laptop CPU
    python train.py --help                # config groups and every option
    python train.py model=timm optimizer=adamw optimizer.lr=1e-3
    python train.py experiment=shapes_segmentation   # another task: what a batch means, its loss and metrics

Hydra composes the config from conf/; the pieces this file calls live in src/trainkit/.
"""
from trainkit import startup  # stdlib only: the program's first line, before torch and Hydra import for seconds

if __name__ == "__main__":
    startup.install()  # a stop signal while torch imports is one line, exit 75 (the run's handlers take it over)

import contextlib
import functools
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig
from tqdm import tqdm

from trainkit import cli
from trainkit.augment import attach_sample_transform
from trainkit.checkpointing import (STOP_SIGNAL_NAMES, continue_sweep_job, epoch_plan, finished_value,
                                    load_checkpoint, load_weights, own_run_directory, refuse_another_epoch_plan,
                                    refuse_another_world_size_inside_an_epoch, restore_optimizer_and_schedule,
                                    stop_after_the_test, restore_rank_rng_states, resumed_config, rng_states,
                                    stop_signal, stopped, stopped_before_training, trained_to_the_end, unwrap_model)
from trainkit.config import print_config, to_dict
from trainkit.config.validation import validate
from trainkit.data import DataBundle, build_data, check_same_data
from trainkit.distributed import (ProcessInfo, any_rank, average_batchnorm_statistics, barrier, gather_objects,
                                  process_info)
from trainkit.distributed.launch import start_processes
from trainkit.distributed.parallel import Parallel, parallel_for
from trainkit.early_stopping import EarlyStopping
from trainkit.errors import RunFailed
from trainkit.models import apply_frozen_bn_eval, build_ema, build_model, restore_ema
from trainkit.optim import build_optimizer, build_scheduler
from trainkit.runtime import autocast, grad_scaler, seed_everything
from trainkit.tasks import Task, backward_scale, evaluate, mean_over_update_tokens
from trainkit.tasks.batches import detach
from trainkit.tracking import (EpochTotals, Loggers, LoopTimer, StepProfiler, augmented_samples,
                               build_loggers, data_bound_advice, epoch_line, first_images, log_predictions,
                               quiet_known_noise, run_names, save_png, training_line, warn_if_data_bound,
                               write_provenance, write_summary)
from trainkit.tuning import micro_batches, run_trial
from trainkit.tuning.batch_size_finder import batch_size_that_fits
from trainkit.tuning.lr_finder import LRFinderResult, lr_range_test, set_base_lr
from trainkit.tuning.lr_finder_plot import plot_lr_finder
from trainkit.tuning.micro_batching import micro_batch_size_that_fits
from trainkit.tuning.trial_gpus import on_its_own_gpus  # feature: trial_gpus

log = logging.getLogger("train")
quiet_known_noise()  # known, harmless plugin log lines; real warnings still show


@dataclass
class Run:
    """One process's share of a run: what it trains with, and where it stands. A plain record,
    not a trainer: the functions below fill it, read it and move it forward, in the open."""
    cfg: DictConfig
    run_dir: Path
    proc: ProcessInfo
    device: torch.device
    # The pieces, made by build_run:
    data: DataBundle = field(init=False)
    model: torch.nn.Module = field(init=False)  # the bare model: its weights are checkpointed
    trained_model: torch.nn.Module = field(init=False)  # the same, compiled and/or DDP-wrapped: what the loop calls
    parallel: Parallel = field(default_factory=Parallel)  # one process, DDP or FSDP: trainkit.distributed.parallel
    train_transform: torch.nn.Module = field(init=False)  # the data option's: images scale, resize, augment, normalize
    eval_transform: torch.nn.Module = field(init=False)  # (batched, on the device); tokens: nothing
    task: Task = field(init=False)  # what a batch means: its loss, its metrics (classification, segmentation, yours)
    resolved_config: dict = field(init=False)  # cfg as plain containers, resolved once built: in every checkpoint
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: torch.optim.lr_scheduler.LRScheduler = field(init=False)
    scaler: torch.amp.GradScaler = field(init=False)
    early_stopping: EarlyStopping = field(init=False)
    timer: LoopTimer = field(default_factory=LoopTimer)  # each epoch: waiting for data vs the rest; debug=profile
    ema: torch.optim.swa_utils.AveragedModel | None = None  # regularization.ema: evaluated in place of the weights
    loggers: Loggers = field(default_factory=lambda: Loggers([]))  # none on other ranks: rank 0 alone logs
    shown: tuple[torch.Tensor, torch.Tensor] | None = None  # rank 0, logger.log_predictions: val images and targets
    # Where the run stands (what a checkpoint restores):
    epoch: int = 0
    step: int = 0  # optimizer updates so far: the LR schedule's clock
    batches_done: int = 0  # batches of `epoch` trained; > 0 after a mid-epoch resume
    best_metrics: dict = field(default_factory=dict)
    last_metrics: dict = field(default_factory=dict)  # the last validated epoch's: summary.json's "final"
    tracker_run_ids: dict = field(default_factory=dict)  # {wandb/mlflow: its run id}: a resume continues those runs
    started: float = field(default_factory=time.perf_counter)  # this process's part of the run began
    earlier_seconds: float = 0.0  # the wall time of the parts before a resume, up to their last checkpoint
    stopping: str | None = None  # why training ends (stop_reason's answer), once it is decided

    def state_dict(self) -> dict:
        """What a checkpoint holds: everything a resume needs, as plain containers and tensors
        (torch.load(weights_only=True) reads them back). Every rank calls it: each rank's RNG streams
        go in. A field you add to Run that a resume needs goes here and into load_state_dict."""
        unfinished = self.batches_done < batches_per_epoch(self.cfg, self.data.train)
        return {
            "model": unwrap_model(self.model).state_dict(),  # no module. / _orig_mod. prefixes
            "ema": None if self.ema is None else self.ema.state_dict(),  # AveragedModel's: module.<name>, n_averaged
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "best_metrics": self.best_metrics,
            "last_metrics": self.last_metrics,
            "epoch": self.epoch,
            "step": self.step,
            "batches_done": self.batches_done if unfinished else 0,  # > 0: a resume finishes this epoch first
            "epoch_plan": gather_objects(this_epochs_plan(self)) if unfinished else None,  # a resume must find it again
            "rng": gather_objects(rng_states()),  # every rank's streams, in rank order
            "config": self.resolved_config,
            "data": self.data.fingerprint,  # what the splits held: a resume refuses other data
            "class_names": self.data.class_names,  # what eval.py's predictions call the classes, without the data
            "wandb_run_id": self.loggers.run_ids.get("wandb"),
            "mlflow_run_id": self.loggers.run_ids.get("mlflow"),
            "wall_seconds": self.earlier_seconds + time.perf_counter() - self.started,  # every part so far
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where a checkpoint stands: weights and EMA, optimizer and schedule (this config's
        hyperparameters where they changed), scaler, early stopping, position, W&B run, RNG streams."""
        check_same_data(state.get("data"), self.data.fingerprint)  # one line naming what changed since
        if self.cfg.trainer.micro_batch_size == "auto":  # the size this run found, not a new search
            self.cfg.trainer.micro_batch_size = state["config"]["trainer"].get("micro_batch_size")
            self.resolved_config["trainer"]["micro_batch_size"] = self.cfg.trainer.micro_batch_size
        load_weights(self.model, state["model"])
        restore_ema(self.ema, state)
        self.best_metrics, self.step, self.batches_done = state["best_metrics"], state["step"], state["batches_done"]
        self.epoch = state["epoch"] + (0 if self.batches_done else 1)  # the unfinished epoch, else the next
        refuse_another_world_size_inside_an_epoch(state, self.proc.world_size)
        if self.batches_done:  # inside an epoch: the batches it skips must be those the checkpoint's run trained
            refuse_another_epoch_plan(state, this_epochs_plan(self), self.resolved_config, self.proc.rank, self.device)
        self.scheduler = build_lr_schedule(self)  # from where the run stands: the updates an epoch may have changed
        restore_optimizer_and_schedule(self.optimizer, self.scheduler, state, self.cfg)
        self.scaler.load_state_dict(state["scaler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        self.last_metrics = state.get("last_metrics", {})  # older checkpoints lack it
        self.tracker_run_ids = {"wandb": state.get("wandb_run_id"), "mlflow": state.get("mlflow_run_id")}
        self.earlier_seconds = state.get("wall_seconds", 0.0)  # older checkpoints lack it
        self.stopping = trained_to_the_end(state, self.cfg)  # killed during its test, before summary.json: test only
        reseed = self.cfg.seed + self.proc.rank + 1000 * self.epoch  # another number of ranks: fresh, distinct streams
        restore_rank_rng_states(state["rng"], self.proc.rank, self.proc.world_size, reseed)


def batches_per_epoch(cfg: DictConfig, loader) -> int:
    return min(len(loader), cfg.trainer.limit_train_batches or len(loader))


def this_epochs_plan(run: Run) -> dict:
    """What epoch `run.epoch` trains on this rank, batch by batch and update by update (a digest)."""
    cfg = run.cfg
    return epoch_plan(run.data.train.epoch_batches(run.epoch), batches_per_epoch(cfg, run.data.train),
                      cfg.trainer.accumulate_grad_batches)


def updates_per_epoch(cfg: DictConfig, loader) -> int:
    """Optimizer updates an epoch: the last group of micro-batches updates too, even when short."""
    return math.ceil(batches_per_epoch(cfg, loader) / cfg.trainer.accumulate_grad_batches)


def train_step(run: Run, batch: Any, micro_batch_size: int | None = None, group_size: int = 1, sync: bool = True,
               totals: EpochTotals | None = None) -> tuple:
    """Forward, loss and backward of a batch (any nested tensors, on the device) in parts, weighed so the gradients
    sum to its update's (tasks.weighting). task.step is what a part means: the model's forward and the loss.
    The loop, both finders and micro_batch_size=auto call this: a change here is theirs too."""
    task = run.task
    with autocast(run.parallel.precision, run.device):  # the whole batch: MixUp/CutMix mix across it
        batch = task.augment(task.transform(batch, run.train_transform))
    parts = micro_batches(batch, micro_batch_size, sized=run.data.size_unit is not None)  # sized: N units (tokens)
    for n, (part, share) in enumerate(parts, start=1):
        sync_part = sync and n == len(parts)  # DDP and FSDP reduce the gradients of an update's last part only
        with run.parallel.gradient_sync(run.trained_model, sync_part), autocast(run.parallel.precision, run.device):
            loss, outputs = task.step(run.trained_model, part)
            run.timer.phase("backward")
            part_weight = task.weight(part)  # samples, or real tokens
            run.scaler.scale(loss * backward_scale(task, part_weight, share, group_size)).backward()
        if totals is not None:
            totals.add(loss.detach(), task.metric_sums(detach(outputs), task.targets(part)), part, part_weight)
    return loss.detach(), task.weight(batch)  # the last part's loss, what the batch weighs


def train_one_epoch(run: Run, show_progress: bool, compiling: bool = False) -> dict:
    """One pass over this rank's shard, from batch `run.batches_done` (a mid-epoch resume).
    Moves run.step and run.batches_done forward; returns the epoch's training metrics. `compiling`:
    torch.compile compiles in the first step, which is timed apart from train/samples_per_sec."""
    model, optimizer, device = run.trained_model, run.optimizer, run.device
    trainer = SimpleNamespace(**to_dict(run.cfg.trainer))  # plain values: an OmegaConf read costs ~20 us a step
    model.train()
    apply_frozen_bn_eval(model)  # BatchNorm inside frozen layers keeps its statistics
    accumulate, num_batches = trainer.accumulate_grad_batches, batches_per_epoch(run.cfg, run.data.train)
    progress = tqdm(total=num_batches, initial=run.batches_done, desc=f"epoch {run.epoch}", leave=False,
                    dynamic_ncols=True, disable=not show_progress)
    totals = EpochTotals(device, run.data.kind == "tokens", run.data.pad_id, run.model)  # on the device until logged
    mid_epoch_saves, compile_seconds = 0, None
    run.timer.start_epoch(device, skip_first=compiling)  # trainkit.tracking.timing: no per-step host-device sync
    for i, batch in enumerate(run.data.train, start=run.batches_done):
        if i >= num_batches or (trainer.max_steps and run.step >= trainer.max_steps):
            break
        group_start = i - i % accumulate  # an update's batches form a group; each weighs 1 / its real size:
        group_size = min(accumulate, num_batches - group_start)  # the epoch's last group may be short
        is_update = i - group_start == group_size - 1
        batch = run.task.to_device(batch, device)
        run.timer.batch_ready()  # waiting for data (the loader, the copy) ends here; the rest is the step
        loss, _ = train_step(run, batch, trainer.micro_batch_size, group_size, is_update, totals)
        run.timer.phase("optimizer_step")
        if is_update:  # a tokens task: the mean over the update's real tokens, every rank's
            mean_over_update_tokens(run.task, model, totals.update_weight(), run.proc.world_size)
            if trainer.grad_clip:
                run.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.grad_clip)
            run.scaler.step(optimizer)
            run.scaler.update()
            optimizer.zero_grad(set_to_none=True)
            run.scheduler.step()
            run.step += 1
            if run.ema is not None:
                run.ema.update_parameters(run.model)
        run.timer.phase("bookkeeping")
        run.batches_done = i + 1
        if compiling and compile_seconds is None:  # compile + first step: throughput is measured from here
            loss.item()  # waits for the device, so this step's work is counted in its own time
            compile_seconds = totals.time_from_here()
        logged_loss = None  # the mean since the last logging step, over all ranks, at a logging step
        if is_update and run.step % trainer.log_every_n_steps == 0:
            logged_loss = totals.interval_mean_loss()
            run.loggers.log({"epoch": run.epoch, "step": run.step, "lr": optimizer.param_groups[0]["lr"],
                             "train/step_loss": logged_loss})
        if is_update and run.batches_done < num_batches and (stopping := stop_reason(run, logged_loss)):
            run.stopping = stopping  # a stop signal or a non-finite loss (at the epoch's last batch: train decides)
            break
        every = trainer.checkpoint_every_n_steps
        if is_update and every and run.step % every == 0 and run.batches_done < num_batches:
            save_checkpoints(run)  # mid-epoch: a long epoch survives preemption
            mid_epoch_saves += 1
        progress.update()
        if show_progress and (i % 10 == 0 or i == num_batches - 1):
            progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}",
                                 refresh=False)  # drawn at tqdm's next timed refresh: no extra terminal write
        run.timer.step_done()
    progress.close()
    if mid_epoch_saves and run.proc.is_main:
        log.info(f"epoch {run.epoch:>3}  {mid_epoch_saves} mid-epoch checkpoints "
                 f"(every {trainer.checkpoint_every_n_steps} updates) -> checkpoints/{run.parallel.last}")
    if compile_seconds is not None and run.proc.is_main:
        log.info(f"compile + first step: {compile_seconds:.1f}s (left out of train/samples_per_sec)")
    return {**totals.epoch_metrics(run.task), "lr": optimizer.param_groups[0]["lr"], **run.timer.epoch_metrics()}


def save_checkpoints(run: Run, improved: bool = False) -> None:
    """checkpoints/last.pt (and best.pt when `improved`), atomically. Every rank calls this, since
    every rank's RNG streams go in; rank 0 alone writes, and never non-finite weights over a good
    checkpoint (the non-finite loss that caused them stops the run at the next logging step)."""
    state = run.state_dict()  # a collective: every rank's RNG streams are gathered
    written = run.parallel.save(run.run_dir / "checkpoints", state, run.model, run.optimizer, improved)
    if not written and run.proc.is_main:
        log.warning(f"checkpoints/{run.parallel.last} not updated at step {run.step}: the weights are not finite")


def stop_reason(run: Run, train_loss: float | None, epoch_done: bool = False) -> str | None:
    """The one place that decides whether training ends, and why: after each update (a stop signal;
    a non-finite loss, seen at logging steps) and after each epoch (also early stopping, max_steps,
    max_epochs, which win over a signal: a finished run finishes). `train_loss` is all-reduced (None
    between logging steps), so every rank gets the same answer and no rank waits alone in a collective."""
    if train_loss is not None and not math.isfinite(train_loss):
        if run.proc.is_main:  # last.pt never holds non-finite weights (save_checkpoints); there may be none yet
            kept = ("checkpoints/last.pt keeps the last finite weights"
                    if (run.run_dir / "checkpoints" / "last.pt").exists() else "no checkpoint was saved before it")
            log.error(f"train/loss is not finite at epoch {run.epoch}, step {run.step}: lower optimizer.lr or set "
                      f"trainer.grad_clip ({kept})")
        return "non-finite loss"
    if epoch_done:  # (inside an epoch, no config read: one costs ~20 us, a step ~10 ms)
        trainer, stopping = run.cfg.trainer, run.early_stopping
        if any_rank(stopping.should_stop, run.device):
            log.info(stopping.stop_line())
            return "early_stopping"
        if trainer.max_steps and run.step >= trainer.max_steps:
            return "max_steps"
        if run.epoch + 1 >= trainer.max_epochs:
            return "max_epochs"
    return stop_signal(run.device, agree=train_loss is not None)  # SIGTERM, SIGUSR1, SIGINT: save and exit 75


def build_run(cfg: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> Run:
    """Data, model, batch transforms, loss, optimizer and LR schedule, in that order."""
    run = Run(cfg, run_dir, proc, device)
    run.data = build_data(cfg.data, device=device, seed=cfg.seed, rank=proc.rank, world_size=proc.world_size,
                          resumed_from=cfg.resume, run_dir=run_dir)  # data.tokenizer=bpe: trained and saved there
    for key in ("vocabulary", "pad_id", "num_classes"):  # null: the data's (a tokenizer's ids, an image folder's
        if key in cfg.data and cfg.data[key] is None:   # classes); the model reads these keys
            cfg.data[key] = getattr(run.data, key)
    model, input_size = build_model(cfg.model, cfg.finetune, image_size=run.data.image_size)
    channels_last = cfg.trainer.channels_last
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    # Module.to takes a device and a memory_format together; torch's overloads list memory_format alone.
    model = model.to(device, memory_format=memory_format)  # type: ignore[call-overload]
    run.parallel = parallel_for(cfg, proc, device)  # before the optimizer takes the params: FSDP shards them
    run.model = run.trained_model = run.parallel.prepare(model)
    run.task = instantiate(cfg.task)  # after the data: an image folder's class count is known
    run.task.tokenizer = run.data.tokenizer  # text: what an id's bytes and text are (a language model's bpb, samples)
    run.train_transform, run.eval_transform = run.data.transforms(cfg.augmentation, input_size, channels_last, device)
    run.scaler = grad_scaler(cfg.precision.name, device)
    step = functools.partial(train_step, run)  # the finders train with the loop's own step
    if (finder := cfg.batch_size_finder).enabled and not cfg.resume:  # the largest batch a process fits
        cfg.data.batch_size = batch_size_that_fits(
            run.model, step, run.task, run.data.train, device, start=finder.start, max_batch_size=finder.max_batch_size,
            safety_margin=finder.safety_margin, memory_cap_gb=finder.memory_cap_gb)
        run.data = build_data(cfg.data, device=device, seed=cfg.seed, rank=proc.rank, world_size=proc.world_size,
                              run_dir=run_dir)
    attach_sample_transform(run.data.train, cfg.augmentation)  # image folders: torchvision per image, in the workers
    if cfg.trainer.micro_batch_size == "auto" and not cfg.resume:  # a resume reuses the size found: load_state_dict
        cfg.trainer.micro_batch_size = micro_batch_size_that_fits(
            run.model, step, run.task, run.data.train, device, unit=run.data.size_unit,
            memory_cap_mb=cfg.trainer.micro_batch_memory_cap_mb)
    run.optimizer = build_optimizer(run.model, cfg.optimizer, batch_size=cfg.data.batch_size,
                                    world_size=proc.world_size, accumulate=cfg.trainer.accumulate_grad_batches)
    run.scheduler = build_lr_schedule(run)
    run.early_stopping = EarlyStopping(**cfg.regularization.early_stopping)
    run.ema = build_ema(run.model, cfg.regularization.ema)  # on the device, before compile and DDP
    run.resolved_config = to_dict(cfg)  # the config is complete now (num_classes, batch size); nothing changes it later
    return run


def build_lr_schedule(run: Run) -> torch.optim.lr_scheduler.LRScheduler:
    """A multiplier of each group's LR, stepped once per optimizer update (warmup and decay are
    counted in updates), so a resume continues the curve exactly.

    Its clock counts epochs: where a resume changed the updates an epoch (data.batch_size, the number
    of processes, accumulate_grad_batches, limit_train_batches: allowed at an epoch's end), the updates
    trained before count as the epochs they trained, so the curve goes on from that epoch and still
    ends on the run's last update. Without such a change, `shift` is 0: the clock is the update count."""
    trainer = run.cfg.trainer
    updates = updates_per_epoch(run.cfg, run.data.train)
    position = run.epoch * updates + run.batches_done // trainer.accumulate_grad_batches
    shift = position - run.step
    total_updates = min(updates * trainer.max_epochs, trainer.max_steps + shift if trainer.max_steps else math.inf)
    return build_scheduler(run.optimizer, run.cfg.scheduler, updates, total_updates, shift)


def start_logging(run: Run, provenance: dict) -> None:
    """Rank 0: metrics.jsonl plus the chosen trackers (given the config and provenance.json's facts; a resume
    continues their runs), a grid of augmented samples for them, and the validation images whose predictions
    they show after each validation."""
    run_name, group = run_names(run_dir=run.run_dir)
    run.loggers = build_loggers(run.cfg.logger, run.run_dir, config=run.resolved_config, run_name=run_name,
                                group=group, resume_ids=run.tracker_run_ids, provenance=provenance,
                                resume_step=run.step if run.cfg.resume else None)
    if run.cfg.logger.get("log_images", False) and run.data.kind == "image" and not run.cfg.resume:  # once a run
        samples = augmented_samples(run.data.train, run.train_transform, run.data.mean, run.data.std, run.device)
        run.loggers.log_image("train/samples", save_png(samples, run.run_dir / "train_samples.png"), run.step)
    if run.cfg.logger.get("log_predictions", 0) and run.data.kind in ("image", "tokens"):  # tokens: a text sample
        run.shown = first_images(run.data.val, run.task, run.cfg.logger.log_predictions, run.device)


def find_lr(run: Run) -> LRFinderResult:
    """LR range test on the real model and data, with the loop's step (every rank takes part; rank 0 plots).
    Model, optimizer and RNG are restored after; with lr_finder.apply the suggestion becomes the base LR.
    A stop signal ends it within a step: nothing trained yet, so nothing saved (exit 75)."""
    finder, step = run.cfg.lr_finder, functools.partial(train_step, run)
    result = lr_range_test(run.trained_model, run.optimizer, step, run.task, run.data.train, run.device,
                           scheduler=run.scheduler, grad_scaler=run.scaler, grad_clip=run.cfg.trainer.grad_clip,
                           min_lr=finder.min_lr, max_lr=finder.max_lr, num_steps=finder.num_steps,
                           smoothing=finder.smoothing, divergence_factor=finder.divergence_factor,
                           should_stop=lambda: stop_signal(run.device, agree=True))
    if result.stopped_by:  # within a step of the signal; model and optimizer are as before the finder
        raise stopped_before_training(result.stopped_by, "during the LR finder")
    if run.proc.is_main:
        run.loggers.log_image("lr_finder", plot_lr_finder(result, run.run_dir / "lr_finder.png"), run.step)
    if finder.apply and result.suggestion:
        set_base_lr(run.optimizer, result.suggestion)  # each parameter group keeps its lr_scale
        run.scheduler = build_lr_schedule(run)
    return result


def test_and_summarize(run: Run, last_metrics: dict, stop_reason: str) -> dict:
    """Test with the best weights, then write summary.json. Rank 0 reads best.pt and sends the
    weights to every rank, so nodes need not share a file system. Without best.pt (deleted before a
    resume; no finite epoch) the last weights are tested: one warning, and summary.json says so."""
    best_checkpoint = run.run_dir / "checkpoints" / "best.pt"
    best_missing = any_rank(run.proc.is_main and not best_checkpoint.exists(), run.device)  # every rank alike
    if best_missing and run.proc.is_main and run.best_metrics:  # no epoch validated (a non-finite loss): none to miss
        log.warning(f"{best_checkpoint} is missing: testing the last weights, not those of the best epoch")
    checkpoint = load_checkpoint(best_checkpoint, run.device) if run.proc.is_main and not best_missing else None
    run.parallel.load_best(checkpoint, not best_missing, run.model, run.ema)  # rank 0's, on every rank
    with run.parallel.full_parameters(run.model):  # FSDP: ranks may have unequal numbers of test batches
        test = evaluate(run.ema or run.trained_model, run.data.test, run.eval_transform, run.task,
                        run.cfg.precision.name, run.device, tta_flip=run.cfg.trainer.tta_flip)
    test_metrics = {f"test/{name}": value for name, value in test.items() if name != "samples"}
    test_weights = "best" if not best_missing else "last (best.pt missing)" if run.best_metrics else "last (no epoch)"
    wall_seconds = run.earlier_seconds + time.perf_counter() - run.started  # every part of a resumed run
    return write_summary(run, last_metrics, test_metrics, stop_reason, wall_seconds, test_weights)


def train(cfg: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> dict:
    """One process's part of the run: the only process, or one rank of many (each DDP worker starts here,
    inside the process group: trainkit.distributed.launch.start_processes). Returns the summary."""
    started = time.perf_counter()
    # Rank 0 records the code (commit, uncommitted changes), command, packages and machine: provenance.json.
    provenance = write_provenance(run_dir, Path(__file__).parent, cfg.seed, cfg.trainer.deterministic,
                                  proc.world_size, device) if proc.is_main else {}
    seed_everything(cfg.seed + proc.rank)  # each rank draws its own augmentation and dropout
    run = build_run(cfg, run_dir, proc, device)
    run.started = started
    if cfg.resume:  # continue exactly: weights, optimizer, schedule, position, every RNG stream
        run.load_state_dict(run.parallel.load(cfg.resume, run.model, run.optimizer, device))
        log.info(f"resumed from {cfg.resume} at epoch {run.epoch}, batch {run.batches_done}, step {run.step}")
    run.trained_model = run.parallel.wrap(run.model, compile=cfg.trainer.compile)  # compiled, then DDP's

    failed = True  # until the run ends normally: the tracker then marks it finished, else failed
    try:
        if proc.is_main:
            start_logging(run, provenance)
        if cfg.lr_finder.enabled and not cfg.resume:
            find_lr(run)
        show_progress = proc.is_main and cfg.trainer.progress_bar and sys.stderr.isatty()
        log.info(training_line(run.model, cfg.trainer, updates_per_epoch(cfg, run.data.train), device, run_dir,
                               provenance.get("code"), batch_size=cfg.data.batch_size, longest=run.data.longest,
                               unit=run.data.size_unit))

        # ---- the loop: train an epoch, validate, log, checkpoint, decide whether to go on ----
        last_metrics = run.last_metrics  # {} unless resumed
        first_epoch = run.epoch  # torch.compile compiles in this process's first step
        advice = data_bound_advice(run.data.train, cfg.data, device.type == "cuda") if cfg.profiler.enabled else []
        run.timer = LoopTimer(StepProfiler(cfg.profiler, run_dir if proc.is_main else None, device, advice))  # rank 0
        for epoch in range(run.epoch, cfg.trainer.max_epochs):
            if run.stopping:  # decided at the last epoch's end, or before a resume of a run trained to its end
                break
            run.epoch = epoch
            run.data.train.set_epoch(epoch, start_batch=run.batches_done)  # a resume skips what it trained
            train_metrics = train_one_epoch(run, show_progress, compiling=cfg.trainer.compile and epoch == first_epoch)
            if run.stopping:  # inside the epoch (a stop signal, a non-finite loss): no validation
                break
            for model in filter(None, (run.model, run.ema)):  # every rank's shard's statistics, before eval and save
                average_batchnorm_statistics(model)
            with run.parallel.full_parameters(run.model):  # FSDP: every rank holds the whole model (uneven batches)
                val = evaluate(run.ema or run.trained_model, run.data.val, run.eval_transform, run.task,
                               cfg.precision.name, device, cfg.trainer.limit_val_batches, cfg.trainer.tta_flip)
            val_metrics = {f"val/{name}": value for name, value in val.items() if name != "samples"}
            run.last_metrics = last_metrics = {"epoch": epoch, "step": run.step, **train_metrics, **val_metrics}
            improved = run.early_stopping.update(last_metrics[run.early_stopping.monitor], epoch)
            if improved:
                run.best_metrics = {"epoch": epoch, "step": run.step, **val_metrics}
            run.loggers.log(last_metrics)
            with run.parallel.full_parameters(run.model, enabled=bool(cfg.logger.get("log_predictions", 0))):
                if run.shown is not None:  # rank 0 alone: the same images every epoch, what the task predicts for them
                    log_predictions(run.loggers, run.ema or run.model, run.shown, run.eval_transform, run.task,
                                    cfg.precision.name, device, run.step, cfg.trainer.tta_flip)
            if proc.is_main:
                log.info(epoch_line(epoch, train_metrics, val, improved))
                warn_if_data_bound(run.timer, train_metrics, run.data.train, cfg.data)  # once a run, with advice
            run.stopping = stop_reason(run, train_metrics["train/loss"], epoch_done=True)
            if run.stopping != "non-finite loss":  # non-finite weights never overwrite the last good checkpoint
                save_checkpoints(run, improved)
            run.batches_done = 0
        reason = run.stopping or "max_epochs"  # a resumed run that had finished trains no epoch
        if reason in STOP_SIGNAL_NAMES:  # a checkpoint at this exact update, one line saying how to resume, exit 75
            if run.batches_done:
                save_checkpoints(run)
            raise stopped(reason, run_dir, run.epoch, run.step, proc.is_main)
        run.timer.profiler.close()
        summary = test_and_summarize(run, last_metrics, reason)
        if not (failed := reason == "non-finite loss"):  # a stop signal in the last epoch or the test: exit 75 now
            stop_after_the_test(run_dir, run.epoch, run.step, device, proc.is_main)
    finally:
        run.loggers.finish(failed=failed)
    if failed:  # logged in one line by stop_reason; exit 1 once rank 0 wrote summary.json (srun --kill-on-bad-exit)
        barrier()
        raise RunFailed(f"train/loss is not finite (stop_reason in {run_dir / 'summary.json'})")
    return summary


@hydra.main(version_base=None, config_path="conf", config_name="config")
@cli.report_config_errors
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # One run a directory: rank 0 (or the parent of the DDP workers it starts) owns it until the run ends,
    # before a resume trims metrics.jsonl; a second run started there gets one line naming the owner.
    owns = process_info().is_main
    with own_run_directory(run_dir, "resume" if cfg.resume else "hydra.run.dir") if owns else contextlib.nullcontext():
        continue_sweep_job(cfg, run_dir)  # a rerun multirun: a job whose directory holds a run continues it
        cfg, finished = resumed_config(cfg, run_dir)  # resume: the checkpoint's config, this command's overrides
        if finished:  # nothing left to train; one line said how to extend the run
            return finished_value(run_dir)
        validate(cfg)  # every error the config alone can reveal, before any data or model is built
        if cfg.print_config:
            print_config(cfg, run_dir)
        # In a multirun, a crashing trial reports sweep.failed_trial_value to the sweeper and the sweep goes on.
        trial: Callable[[DictConfig], float | None] = functools.partial(optimized_value, run_dir=run_dir)
        trial = on_its_own_gpus(trial)  # feature: trial_gpus (parallel jobs on several GPUs: each its own)
        return run_trial(trial, cfg)


def optimized_value(cfg: DictConfig, run_dir: Path) -> float | None:
    """Train here, or in the DDP processes started for this run: the value a sweeper optimizes."""
    return start_processes(cfg, run_dir, train)["optimized_value"]


if __name__ == "__main__":
    cli.run(main)
