"""train.py's `Run`: one process's share of a run, what a checkpoint holds of it, and the run's end (the test with the
best weights, summary.json). A field you add to Run that a resume needs goes into state_dict and load_state_dict."""

import contextlib
import logging
import math
import time
from collections.abc import Sized
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig

from trainkit.checkpointing import (
    epoch_plan,
    load_checkpoint,
    load_weights,
    refuse_another_epoch_plan,
    refuse_another_world_size_inside_an_epoch,
    restore_averaged,
    restore_optimizer_and_schedule,
    restore_rank_rng_states,
    rng_states,
    trained_to_the_end,
    unwrap_model,
)
from trainkit.checkpointing.files import upgrade_fingerprint
from trainkit.data import DataBundle, check_same_data
from trainkit.distributed import ProcessInfo, any_rank, gather_objects
from trainkit.distributed.parallel import Parallel
from trainkit.early_stopping import EarlyStopping
from trainkit.schedules import build_scheduler
from trainkit.tasks import Task, evaluate
from trainkit.tracking import Loggers, recorded_origin, training_line, write_summary
from trainkit.tracking.timing import LoopTimer  # feature: loop_timing

log = logging.getLogger("train")  # train.py's logger: these are its lines


@dataclass
class TrainState:
    """Where a run stands: the one part of `Run` the loop writes, and what a checkpoint holds of its position."""

    epoch: int = 0
    step: int = 0  # optimizer updates so far: the LR schedule's clock
    batches_done: int = 0  # batches of `epoch` trained; > 0 after a mid-epoch resume
    best_metrics: dict = field(default_factory=dict)
    last_metrics: dict = field(default_factory=dict)  # the last validated epoch's: summary.json's "final"
    tracker_run_ids: dict = field(default_factory=dict)  # {tracker: its run id}: a resume continues those runs
    earlier_seconds: float = 0.0  # the wall time of the parts before a resume, up to their last checkpoint
    stopping: str | None = None  # why training ends (stop_reason's answer), once it is decided

    def state_dict(self, unfinished: bool, seconds_here: float) -> dict:
        """Its part of a checkpoint. `unfinished`: saved inside an epoch, which a resume finishes first;
        `seconds_here`: this process's part of the run so far."""
        return {
            "best_metrics": self.best_metrics,
            "last_metrics": self.last_metrics,
            "epoch": self.epoch,
            "step": self.step,
            "batches_done": self.batches_done if unfinished else 0,
            "wall_seconds": self.earlier_seconds + seconds_here,  # every part so far
        }

    def load_state_dict(self, checkpoint: dict, cfg: DictConfig) -> None:
        """Stand where `checkpoint` stood: in its unfinished epoch, else at the start of the next."""
        self.best_metrics, self.step = checkpoint["best_metrics"], checkpoint["step"]
        self.batches_done = checkpoint["batches_done"]
        self.epoch = checkpoint["epoch"] + (0 if self.batches_done else 1)
        self.last_metrics = checkpoint.get("last_metrics", {})  # older checkpoints lack it
        self.tracker_run_ids = {
            key.removesuffix("_run_id"): value for key, value in checkpoint.items() if key.endswith("_run_id")
        }
        self.earlier_seconds = checkpoint.get("wall_seconds", 0.0)  # older checkpoints lack it
        self.stopping = trained_to_the_end(checkpoint, cfg)  # killed during its test, before summary.json: test only


@dataclass
class Run:
    """One process's share of a run: what it trains with, built before the loop, and `state`, the only part the loop
    writes. A plain record, not a trainer."""

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
    task: Task = field(init=False)  # what a batch means: its loss, its metrics (classification, yours)
    resolved_config: dict = field(init=False)  # cfg as plain containers, resolved once built: in every checkpoint
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: torch.optim.lr_scheduler.LRScheduler = field(init=False)
    scaler: torch.amp.GradScaler = field(init=False)
    # The step's mixed precision (runtime.autocast of parallel.precision), built once and entered for each batch.
    autocast: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)
    early_stopping: EarlyStopping = field(init=False)
    timer: LoopTimer = field(default_factory=LoopTimer)  # feature: loop_timing
    # A feature's average of the weights (regularization.ema), evaluated in their place; None: the model is.
    averaged: torch.optim.swa_utils.AveragedModel | None = None
    loggers: Loggers = field(default_factory=lambda: Loggers([]))  # none on other ranks: rank 0 alone logs
    shown: tuple[torch.Tensor, torch.Tensor] | None = None  # feature: logged_images (val samples a tracker shows)
    started: float = field(default_factory=time.perf_counter)  # this process's part of the run began
    state: TrainState = field(default_factory=TrainState)  # where it stands: the loop moves it forward

    def state_dict(self) -> dict:
        """What a checkpoint holds: everything a resume needs, loadable with weights_only=True. Every rank calls it."""
        unfinished = self.state.batches_done < batches_per_epoch(self.cfg, self.data.train)
        return {
            "model": unwrap_model(self.model).state_dict(),  # no module. / _orig_mod. prefixes
            "averaged": None if self.averaged is None else self.averaged.state_dict(),  # module.<name>, n_averaged
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            **self.state.state_dict(unfinished, time.perf_counter() - self.started),
            "epoch_plan": gather_objects(this_epochs_plan(self)) if unfinished else None,  # a resume must find it again
            "rng": gather_objects(rng_states()),  # every rank's streams, in rank order
            "config": self.resolved_config,
            "data": self.data.fingerprint,  # what the splits held: a resume refuses other data
            "class_names": self.data.class_names,  # what eval.py's predictions call the classes, without the data
            **{f"{name}_run_id": run_id for name, run_id in self.loggers.run_ids.items()},  # "wandb_run_id", ...
        }

    def load_state_dict(self, checkpoint: dict) -> None:
        """Continue where a checkpoint stands: weights and their average, position, optimizer and schedule (this
        config's hyperparameters where they changed), scaler, early stopping, trackers' runs, RNG streams."""
        check_same_data(upgrade_fingerprint(checkpoint.get("data")), self.data.fingerprint)  # one line: what changed
        load_weights(self.model, checkpoint["model"])
        restore_averaged(self.averaged, checkpoint)
        self.state.load_state_dict(checkpoint, self.cfg)
        refuse_another_world_size_inside_an_epoch(checkpoint, self.proc.world_size)
        if self.state.batches_done:  # inside an epoch: the batches it skips must be those the checkpoint's run trained
            plan = this_epochs_plan(self)
            refuse_another_epoch_plan(checkpoint, plan, self.resolved_config, self.proc.rank, self.device)
        self.scheduler = build_lr_schedule(self)  # from where the run stands: the updates an epoch may have changed
        restore_optimizer_and_schedule(self.optimizer, self.scheduler, checkpoint, self.cfg)
        self.scaler.load_state_dict(checkpoint["scaler"])
        self.early_stopping.load_state_dict(checkpoint["early_stopping"])
        reseed = self.cfg.seed + self.proc.rank + 1000 * self.state.epoch  # another number of ranks: fresh streams
        restore_rank_rng_states(checkpoint["rng"], self.proc.rank, self.proc.world_size, reseed)


def batches_per_epoch(cfg: DictConfig, loader: Sized) -> int:
    """Batches an epoch trains: the loader's, or trainer.limit_train_batches where fewer."""
    return min(len(loader), cfg.trainer.limit_train_batches or len(loader))


def this_epochs_plan(run: Run) -> dict:
    """What epoch `run.state.epoch` trains on this rank, batch by batch and update by update (a digest)."""
    batches = batches_per_epoch(run.cfg, run.data.train)
    return epoch_plan(run.data.train.epoch_batches(run.state.epoch), batches, run.cfg.trainer.accumulate_grad_batches)


def updates_per_epoch(cfg: DictConfig, loader: Sized) -> int:
    """Optimizer updates an epoch: the last group of micro-batches updates too, even when short."""
    return math.ceil(batches_per_epoch(cfg, loader) / cfg.trainer.accumulate_grad_batches)


def build_lr_schedule(run: Run) -> torch.optim.lr_scheduler.LRScheduler:
    """A multiplier of each group's LR, stepped once per optimizer update. Where a resume changed the updates an epoch,
    the updates trained before count as the epochs they trained, so the curve still ends on the run's last update."""
    trainer = run.cfg.trainer
    updates = updates_per_epoch(run.cfg, run.data.train)
    position = run.state.epoch * updates + run.state.batches_done // trainer.accumulate_grad_batches
    shift = position - run.state.step
    total_updates = min(updates * trainer.max_epochs, trainer.max_steps + shift if trainer.max_steps else math.inf)
    return build_scheduler(run.optimizer, run.cfg.scheduler, updates, total_updates, shift)


def test_and_summarize(run: Run, stop_reason: str) -> dict:
    """Test with the best weights (rank 0 reads best.pt and sends them to every rank), then write summary.json.
    Without best.pt the last weights are tested, with a warning, and summary.json says so."""
    best_checkpoint = run.run_dir / "checkpoints" / "best.pt"
    best_missing = any_rank(run.proc.is_main and not best_checkpoint.exists(), run.device)  # every rank alike
    if best_missing and run.proc.is_main and run.state.best_metrics:  # none to miss where no epoch validated
        log.warning(f"{best_checkpoint} is missing: testing the last weights, not those of the best epoch")
    checkpoint = load_checkpoint(best_checkpoint, run.device) if run.proc.is_main and not best_missing else None
    run.parallel.load_best(checkpoint, not best_missing, run.model, run.averaged)  # rank 0's, on every rank
    model = run.averaged or run.trained_model
    with run.parallel.full_parameters(run.model):  # FSDP: ranks may have unequal numbers of test batches
        test = evaluate(model, run.data.test, run.eval_transform, run.task, run.cfg.precision.name, run.device)
    test_metrics = {f"test/{name}": value for name, value in test.items() if name != "samples"}
    test_weights = (
        "best" if not best_missing else "last (best.pt missing)" if run.state.best_metrics else "last (no epoch)"
    )
    wall_seconds = run.state.earlier_seconds + time.perf_counter() - run.started  # every part of a resumed run
    return write_summary(run, run.state.last_metrics, test_metrics, stop_reason, wall_seconds, test_weights)


def start_line(run: Run) -> str:
    """The run's first line: what trains, where, for how long, which code (tracking.run_report.training_line)."""
    return training_line(
        run.model,
        run.cfg.trainer,
        updates_per_epoch(run.cfg, run.data.train),
        run.device,
        run.run_dir,
        recorded_origin(run.run_dir).get("code") if run.proc.is_main else None,
        batch_size=run.cfg.data.batch_size,
        longest=run.data.longest,
        unit=run.data.size_unit,
        task=run.task,
        world_size=run.proc.world_size,
        fold=run.data.fingerprint.get("fold"),
    )
