"""Train a model: the whole story of one run, top to bottom (`python train.py --help` lists every option).

Hydra composes the config from conf/; the pieces this file calls live in src/trainkit/. Before `main` runs:
- `startup.install()` runs before torch and Hydra import (seconds): a stop signal meanwhile exits 75 in one line.
- `cli.run` rewrites sys.argv, because Hydra creates the run directory from sys.argv before `main` runs: `resume=`
  must continue in the checkpoint's directory, and under torchrun only rank 0 may write Hydra's files.
- `cli.run` lists only our config groups on `--help`: Hydra's own listing walks its ~20 groups too (0.5 s).
- `gc.freeze()` after the imports: no garbage collection walks their ~200k objects again (measured: faster steps).
"""
from trainkit import startup

if __name__ == "__main__":
    startup.install()

import contextlib
import gc
import logging
import math
import sys
import time
from collections.abc import Callable
from functools import partial
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
from trainkit.augment.mixing import mix_batches  # feature: augment_recipes
from trainkit.augment.sample_transforms import attach_sample_transform  # feature: augment_recipes
from trainkit.checkpointing import (STOP_SIGNAL_NAMES, finished_value, own_run_directory, resumed_config,
                                    stop_after_the_test, stop_signal, stopped, trim_records)
from trainkit.checkpointing import sweep_continuation  # feature: sweep_continuation
from trainkit.config import print_config, record_filled_in, resolved, to_dict
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.distributed import ProcessInfo, any_rank, average_batchnorm_statistics, barrier, process_info
from trainkit.distributed.launch import start_processes
from trainkit.distributed.parallel import parallel_for
from trainkit.early_stopping import EarlyStopping
from trainkit.errors import RunFailed
from trainkit.models import build_model
from trainkit.models.finetune import fine_tune  # feature: finetune
from trainkit.models.ema import build_ema, update_ema  # feature: ema
from trainkit.optim import build_optimizer
from trainkit.run import Run, batches_per_epoch, build_lr_schedule, start_line, test_and_summarize
from trainkit.runtime import autocast, grad_scaler, seed_everything
from trainkit.tasks import evaluate, mean_over_update_tokens, micro_batches
from trainkit.tasks.tta_flip import average_with_mirror  # feature: tta_flip
from trainkit.tracking import EpochTotals, epoch_line, log_epoch_notes, start_logging
from trainkit.tracking.bottleneck import warn_if_data_bound  # feature: loop_timing
from trainkit.tracking.config_tree import print_config_tree  # feature: config_tree
from trainkit.tracking.prediction_images import show_predictions, start_showing  # feature: logged_images
from trainkit.tracking.profiling import close_profiler, profiled_timer  # feature: profiler
from trainkit.tracking.provenance import record_provenance  # feature: provenance
from trainkit.tuning.batch_size_finder import searched_batch_size  # feature: batch_size_finder
from trainkit.tuning.lr_finder import find_lr_before_training  # feature: lr_finder
from trainkit.tuning.micro_batching import searched_micro_batch_size  # feature: micro_batch_auto
from trainkit.tuning.sweep_direction import checking_direction  # feature: sweeps
from trainkit.tuning.trial_failures import catching_failures  # feature: trial_failures
from trainkit.tuning.trial_gpus import on_its_own_gpus  # feature: trial_gpus

log = logging.getLogger("train")


def train_step(run: Run, batch: Any, micro_batch_size: int | None = None, group_size: int = 1, sync: bool = True,
               totals: EpochTotals | None = None) -> tuple:
    """Forward, loss and backward of a batch, in micro-batches weighed so the gradients sum to the update's.
    The loop, the finders and micro_batch_size=auto all call this: a change here is theirs too."""
    task = run.task
    with run.autocast:  # the whole batch, since MixUp mixes across it
        batch = task.augment(task.transform(batch, run.train_transform))
    parts = micro_batches(batch, micro_batch_size, sized=run.data.size_unit is not None)
    for n, (part, share) in enumerate(parts, start=1):
        sync_part = sync and n == len(parts)  # DDP and FSDP reduce the gradients once, on the last part
        with run.parallel.gradient_sync(run.trained_model, sync_part), run.autocast:
            loss, outputs = task.step(run.trained_model, part)
            run.timer.phase("backward")  # feature: loop_timing
            part_weight = task.weight(part)  # samples, or real tokens: a tokens task's update divides by them all
            scale = part_weight if task.weighs == "tokens" else share / group_size
            run.scaler.scale(loss * scale).backward()
        recorded = task.take_recorded()
        if totals is not None:
            with torch.no_grad():
                totals.add(loss.detach(), task.metric_sums(outputs, task.targets(part)), part, part_weight, recorded)
    return loss.detach(), task.weight(batch)


def update(run: Run, totals: EpochTotals, grad_clip: float | None, logging: bool = False) -> None:
    """The optimizer update, once an update's micro-batches are backpropagated: then the schedule steps.
    The gradient norm goes to totals.grad_norm where clipping computes it, else at logging steps only."""
    model, optimizer = run.trained_model, run.optimizer
    if run.task.weighs == "tokens":
        mean_over_update_tokens(model, totals.update_weight(), run.proc.world_size)
    if grad_clip or logging:
        run.scaler.unscale_(optimizer)  # the true gradients, not the fp16 scaled ones (scaler.step knows)
        totals.grad_norm = run.parallel.grad_norm(model, grad_clip)
    run.scaler.step(optimizer)
    run.scaler.update()
    optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    run.state.step += 1
    update_ema(run.averaged, run.model)  # feature: ema (the average takes in the new weights)


def log_update(run: Run, totals: EpochTotals, every: int) -> float | None:
    """At a logging step (every `every` updates): the mean loss since the last one, over all ranks, logged and
    returned (stop_reason checks it is finite); None between logging steps."""
    state = run.state
    if state.step % every:
        return None
    metrics = totals.interval_metrics()
    run.loggers.log({"epoch": state.epoch, "step": state.step, "lr": run.optimizer.param_groups[0]["lr"], **metrics})
    return metrics["train/step_loss"]


def train_one_epoch(run: Run, show_progress: bool, compiling: bool = False) -> dict:
    """One pass over this rank's shard, from batch `run.state.batches_done` (a mid-epoch resume); returns the
    epoch's training metrics. `compiling`: the first step compiles, so it is timed apart."""
    state = run.state
    trainer = SimpleNamespace(**to_dict(run.cfg.trainer))  # an OmegaConf read costs ~20 us per step
    run.trained_model.train()
    accumulate, num_batches = trainer.accumulate_grad_batches, batches_per_epoch(run.cfg, run.data.train)
    progress = tqdm(total=num_batches, initial=state.batches_done, desc=f"epoch {state.epoch}", leave=False,
                    dynamic_ncols=True, disable=not show_progress)
    totals = EpochTotals(run.device, run.data.size_unit, run.data.pad_id, run.model)
    mid_epoch_saves, compile_seconds = 0, None
    run.timer.start_epoch(run.device, skip_first=compiling)  # feature: loop_timing
    for i, batch in enumerate(run.data.train, start=state.batches_done):
        if i >= num_batches or (trainer.max_steps and state.step >= trainer.max_steps):
            break
        group_start = i - i % accumulate
        group_size = min(accumulate, num_batches - group_start)
        is_update = i - group_start == group_size - 1
        batch = run.task.to_device(batch, run.device)
        run.timer.batch_ready()  # feature: loop_timing
        loss, _ = train_step(run, batch, trainer.micro_batch_size, group_size, is_update, totals)
        run.timer.phase("optimizer_step")  # feature: loop_timing
        if is_update:
            update(run, totals, trainer.grad_clip, logging=(state.step + 1) % trainer.log_every_n_steps == 0)
        run.timer.phase("bookkeeping")  # feature: loop_timing
        state.batches_done = i + 1
        if compiling and compile_seconds is None:
            loss.item()  # waits for the device, so the compile's step is timed alone
            compile_seconds = totals.time_from_here()
        if is_update:
            logged_loss = log_update(run, totals, trainer.log_every_n_steps)
            if state.batches_done < num_batches:  # after the epoch's last batch, train() decides
                state.stopping = stop_reason(run, logged_loss)
                if state.stopping:
                    break
                if (every := trainer.checkpoint_every_n_steps) and state.step % every == 0:
                    save_checkpoints(run)
                    mid_epoch_saves += 1
        progress.update()
        if show_progress and (i % 10 == 0 or i == num_batches - 1):  # loss.item() waits for the device
            lr = run.optimizer.param_groups[0]["lr"]
            progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.2e}", refresh=False)
        run.timer.step_done()  # feature: loop_timing
    progress.close()
    log_epoch_notes(run, mid_epoch_saves, compile_seconds)
    metrics = {**totals.epoch_metrics(run.task), "lr": run.optimizer.param_groups[0]["lr"]}
    metrics |= run.timer.epoch_metrics()  # feature: loop_timing
    return metrics


def save_checkpoints(run: Run, improved: bool = False) -> None:
    """checkpoints/last.pt (and best.pt when `improved`). Every rank calls it (their RNG states are gathered);
    rank 0 writes, atomically, and never non-finite weights over a good checkpoint."""
    checkpoint = run.state_dict()
    written = run.parallel.save(run.run_dir / "checkpoints", checkpoint, run.model, run.optimizer, improved)
    if not written and run.proc.is_main:
        log.warning(f"checkpoints/{run.parallel.last} not updated at step {run.state.step}: the weights are not finite")


def stop_reason(run: Run, train_loss: float | None, epoch_done: bool = False) -> str | None:
    """The one place that decides whether training ends, and why: after each update and each epoch. Every rank
    gets the same answer (`train_loss` is all-reduced; None between logging steps)."""
    state = run.state
    if train_loss is not None and not math.isfinite(train_loss):
        if run.proc.is_main:
            kept = ("checkpoints/last.pt keeps the last finite weights"
                    if (run.run_dir / "checkpoints" / "last.pt").exists() else "no checkpoint was saved before it")
            log.error(f"train/loss is not finite at epoch {state.epoch}, step {state.step}: lower optimizer.lr or set "
                      f"trainer.grad_clip ({kept})")
        return "non-finite loss"
    if epoch_done:
        trainer, stopping = run.cfg.trainer, run.early_stopping
        if any_rank(stopping.should_stop, run.device):
            log.info(stopping.stop_line())
            return "early_stopping"
        if trainer.max_steps and state.step >= trainer.max_steps:
            return "max_steps"
        if state.epoch + 1 >= trainer.max_epochs:
            return "max_epochs"
    return stop_signal(run.device, agree=train_loss is not None)


def build_run(composed: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> Run:
    """Data, model, transforms, task, optimizer and LR schedule, in that order. What the run finds (the data's
    values, searched sizes) goes into `found`; run.cfg is `composed` with it, resolved and read-only."""
    data = build_data(composed.data, device=device, seed=composed.seed, rank=proc.rank, world_size=proc.world_size,
                      resumed_from=composed.resume, run_dir=run_dir)
    found = {f"data.{key}": getattr(data, key) for key in ("vocabulary", "pad_id", "num_classes")
             if key in composed.data and composed.data[key] is None}
    cfg = resolved(composed, found)
    run = Run(cfg, run_dir, proc, device)
    run.data, channels_last = data, cfg.trainer.channels_last
    model, input_size = build_model(cfg.model), data.image_size
    input_size = fine_tune(model, cfg.model, cfg.finetune, input_size)  # feature: finetune
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)  # type: ignore[call-overload]
    run.parallel = parallel_for(cfg, proc, device)  # before the optimizer: FSDP shards the parameters
    run.model = run.trained_model = run.parallel.prepare(model)
    run.task = instantiate(cfg.task)
    run.task.tokenizer = data.tokenizer
    average_with_mirror(run.task, cfg.trainer.tta_flip)  # feature: tta_flip
    mix_batches(run.task, cfg.augmentation)  # feature: augment_recipes
    run.train_transform, run.eval_transform = data.transforms(cfg.augmentation, input_size, channels_last, device)
    run.scaler = grad_scaler(cfg.precision.name, device)
    run.autocast = autocast(run.parallel.precision, device)
    found |= searched_batch_size(cfg, run, partial(train_step, run), data.train, device)  # feature: batch_size_finder
    found |= searched_micro_batch_size(cfg, run, partial(train_step, run), data, device)  # feature: micro_batch_auto
    run.cfg = cfg = resolved(composed, found)
    if cfg.data.batch_size != data.train.batch_size:
        run.data = build_data(cfg.data, device=device, seed=cfg.seed, rank=proc.rank, world_size=proc.world_size,
                              run_dir=run_dir)
    attach_sample_transform(run.data.train, cfg.augmentation)  # feature: augment_recipes
    run.optimizer = build_optimizer(run.model, cfg.optimizer, batch_size=cfg.data.batch_size,
                                    world_size=proc.world_size, accumulate=cfg.trainer.accumulate_grad_batches)
    run.scheduler = build_lr_schedule(run)
    run.early_stopping = EarlyStopping(**cfg.regularization.early_stopping)
    run.averaged = build_ema(run.model, cfg.regularization.ema)  # feature: ema
    run.resolved_config = to_dict(cfg)
    record_filled_in(cfg, run_dir, proc.is_main)
    return run


def validate_epoch(run: Run, train_metrics: dict) -> bool:
    """Validate (the averaged weights where kept), count it for early stopping and log it; True if it improved."""
    state = run.state
    cfg = run.cfg
    for model in filter(None, (run.model, run.averaged)):
        average_batchnorm_statistics(model)
    with run.parallel.full_parameters(run.model):
        val = evaluate(run.averaged or run.trained_model, run.data.val, run.eval_transform, run.task,
                       cfg.precision.name, run.device, cfg.trainer.limit_val_batches)
    val_metrics = {f"val/{name}": value for name, value in val.items() if name != "samples"}
    state.last_metrics = {"epoch": state.epoch, "step": state.step, **train_metrics, **val_metrics}
    improved = run.early_stopping.update(state.last_metrics[run.early_stopping.monitor], state.epoch)
    if improved:
        state.best_metrics = {"epoch": state.epoch, "step": state.step, **val_metrics}
    run.loggers.log(state.last_metrics)
    show_predictions(run)  # feature: logged_images
    if run.proc.is_main:
        log.info(epoch_line(state.epoch, train_metrics, val, improved))
        warn_if_data_bound(run.timer, train_metrics, run.data.train, cfg.data)  # feature: loop_timing
    return improved


def start_run(cfg: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> Run:
    """The run built and, with cfg.resume, restored, ready to train."""
    started = time.perf_counter()
    record_provenance(cfg, run_dir, Path(__file__).parent, proc, device)  # feature: provenance
    seed_everything(cfg.seed + proc.rank)
    run = build_run(cfg, run_dir, proc, device)
    run.started, cfg = started, run.cfg
    if cfg.resume:
        checkpoint = run.parallel.load(cfg.resume, run.model, run.optimizer, device)
        run.load_state_dict(checkpoint)
        if proc.is_main:  # nothing is left to refuse: the lines the run writes again leave metrics.jsonl
            trim_records(checkpoint, cfg, run_dir)
        state = run.state
        log.info(f"resumed from {cfg.resume} at epoch {state.epoch}, batch {state.batches_done}, step {state.step}")
    run.trained_model = run.parallel.wrap(run.model, compile=cfg.trainer.compile)
    return run


def train(cfg: DictConfig, run_dir: Path, proc: ProcessInfo, device: torch.device) -> dict:
    """One process's part of the run (each DDP worker starts here, inside its process group); returns the summary."""
    run = start_run(cfg, run_dir, proc, device)
    if gc.get_freeze_count():  # `python train.py` froze its imports: what the run built lives on too
        gc.freeze()
    state = run.state
    cfg = run.cfg
    failed = True
    try:
        if proc.is_main:
            start_logging(run)
            start_showing(run)  # feature: logged_images
        find_lr_before_training(run, partial(train_step, run))  # feature: lr_finder
        show_progress = proc.is_main and cfg.trainer.progress_bar and sys.stderr.isatty()
        log.info(start_line(run))

        # ---- the loop: train an epoch, validate, log, checkpoint, decide whether to go on ----
        first_epoch = state.epoch
        run.timer = profiled_timer(run)  # feature: profiler
        for epoch in range(state.epoch, cfg.trainer.max_epochs):
            if state.stopping:
                break
            state.epoch = epoch
            run.data.train.set_epoch(epoch, start_batch=state.batches_done)
            train_metrics = train_one_epoch(run, show_progress, compiling=cfg.trainer.compile and epoch == first_epoch)
            if state.stopping:  # inside the epoch: no validation
                break
            improved = validate_epoch(run, train_metrics)
            state.stopping = stop_reason(run, train_metrics["train/loss"], epoch_done=True)
            if state.stopping != "non-finite loss":
                save_checkpoints(run, improved)
            state.batches_done = 0
        reason = state.stopping or "max_epochs"  # a resumed run that had finished trains no epoch
        if reason in STOP_SIGNAL_NAMES:
            if state.batches_done:
                save_checkpoints(run)
            raise stopped(reason, run_dir, state.epoch, state.step, proc.is_main)
        close_profiler(run.timer)  # feature: profiler
        summary = test_and_summarize(run, reason)
        if not (failed := reason == "non-finite loss"):
            stop_after_the_test(run_dir, state.epoch, state.step, device, proc.is_main)
    finally:
        run.loggers.finish(failed=failed)
    if failed:
        barrier()
        raise RunFailed(f"train/loss is not finite (stop_reason in {run_dir / 'summary.json'})")
    return summary


@hydra.main(version_base=None, config_path="conf", config_name="config")
@cli.report_config_errors
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    owns = process_info().is_main  # one run per directory: a second run started there is refused in one line
    with own_run_directory(run_dir, "resume" if cfg.resume else "hydra.run.dir") if owns else contextlib.nullcontext():
        sweep_continuation.continue_sweep_job(cfg, run_dir)  # feature: sweep_continuation
        cfg, finished = resumed_config(cfg, run_dir)
        if finished:
            return finished_value(run_dir)
        validate(cfg)  # every error the config alone can reveal, before any data or model is built
        show_config: Callable[[DictConfig, Path], None] = print_config  # as YAML
        show_config = print_config_tree  # feature: config_tree
        if cfg.print_config:
            show_config(cfg, run_dir)
        trial: Callable[[DictConfig], float | None] = partial(optimized_value, run_dir=run_dir)
        trial = on_its_own_gpus(trial)  # feature: trial_gpus
        trial = catching_failures(trial)  # feature: trial_failures
        trial = checking_direction(trial)  # feature: sweeps
        return trial(cfg)


def optimized_value(cfg: DictConfig, run_dir: Path) -> float | None:
    """Train here, or in the DDP processes started for this run: the value a sweeper optimizes."""
    return start_processes(cfg, run_dir, train)["optimized_value"]


if __name__ == "__main__":
    sweep_continuation.remember_sweep_command(sys.argv)  # feature: sweep_continuation
    gc.freeze()
    cli.run(main)
