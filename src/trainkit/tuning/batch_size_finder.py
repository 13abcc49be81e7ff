"""Find the largest batch size whose training step fits in memory: double until it does not fit,
binary-search between the last fit and the first failure, keep a safety margin (none when even
`max_batch_size` fits: then the cap, not memory, stopped the search).

    probe = training_step_probe(model, (images, labels), loss_fn, transform, precision)
    batch_size = find_batch_size(probe, start=2, max_batch_size=4096, safety_margin=0.9, device=device)

"Does not fit" means one of:
- the step raises an out-of-memory error (torch.cuda.OutOfMemoryError, or a RuntimeError saying
  "out of memory" / "can't allocate memory": CUDA, MPS, the CPU allocator);
- the step raises MemoryCapExceeded (a try_step that measures memory its own way can raise it);
- `memory_cap_bytes` is set and the step's measured memory is above it. Measured how:
  on CUDA, the allocator's peak (torch.cuda.max_memory_allocated, after resetting it) - the
  true peak of the step, parameters included; elsewhere (CPU, MPS), the bytes of the tensors
  autograd saves for backward during the step (the activations, each storage counted once,
  parameters excluded) - the part of the step's memory that grows with the batch, a lower
  bound on the whole (parameters, gradients, optimizer state and temporaries are not in it).
  On a CPU, set a cap or a max_batch_size: Linux usually kills a process that asks for too
  much memory instead of raising an error the search could catch.

Not in the probe's peak: optimizer state (built later, e.g. 2 x parameters for Adam) and DDP's
gradient buckets (about 1 x parameters); the safety margin is there for them and for memory
fragmentation over a long run.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.data.loaders import FileLoader, TensorLoader
from trainkit.distributed.process_group import min_across_ranks
from trainkit.errors import ConfigError
from trainkit.tasks import batches
from trainkit.tasks.task import Task

log = logging.getLogger(__name__)


class MemoryCapExceeded(RuntimeError):
    """A step used more memory than the configured cap (treated like an out-of-memory error)."""


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (MemoryCapExceeded, torch.cuda.OutOfMemoryError)):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)


def free_memory(device: torch.device | str | None = None) -> None:
    """Drop what a failed step left behind on an accelerator: Python garbage (reference cycles
    holding tensors), then CUDA's cached blocks. On the CPU reference counting has freed the
    tensors already, and a full garbage collection costs more than the step."""
    if device is not None and torch.device(device).type == "cpu":
        return
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Measurement:
    peak_bytes: int | None = None


@contextmanager
def measure_step_memory(device: torch.device | str | None) -> Iterator[_Measurement]:
    """Measure the memory of the code inside (see the module docstring): `.peak_bytes` afterwards."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    measurement = _Measurement()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            yield measurement
        finally:
            torch.cuda.synchronize(device)
            measurement.peak_bytes = torch.cuda.max_memory_allocated(device)
        return
    seen: dict[tuple, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        base = tensor._base if tensor._base is not None else tensor  # a weight is often saved as a view (w.t())
        if not (base.is_leaf and base.requires_grad):  # parameters are not activations
            storage = tensor.untyped_storage()
            seen[(storage.device.type, storage.data_ptr())] = storage.nbytes()
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield measurement
    finally:
        measurement.peak_bytes = sum(seen.values())


def find_batch_size(
    try_step: Callable[[int], None],
    *,
    start: int = 2,
    max_batch_size: int = 4096,
    safety_margin: float = 0.9,
    memory_cap_bytes: int | None = None,
    device: torch.device | str | None = None,
    max_batch_size_from: str = "batch_size_finder.max_batch_size",
) -> int:
    """The largest batch size for which `try_step(batch_size)` fits, times `safety_margin`,
    rounded down (at least 1); or `max_batch_size` itself when that fits (the search stopped at
    the cap, not at memory, so no margin is taken; the log line names the cap: `max_batch_size_from`).

    `try_step` runs one training step at that batch size (see training_step_probe) and should
    leave the model as it found it. Search: start, 2 x start, 4 x start, ... until a step does
    not fit or max_batch_size is reached (max_batch_size itself is tried last); then a binary
    search between the last size that fit and the first that did not, to the exact boundary.
    Memory is freed after each try that did not fit (see free_memory). A start that already does
    not fit is a ConfigError. The settings themselves (1 <= start <= max_batch_size,
    0 < safety_margin <= 1) are checked by trainkit.config.validation.
    """

    def fits(batch_size: int) -> bool:
        reason = None
        try:
            with measure_step_memory(device) as measurement:
                try_step(batch_size)
            assert measurement.peak_bytes is not None  # set as the with block ends
            if memory_cap_bytes is not None and measurement.peak_bytes > memory_cap_bytes:
                reason = f"{_gib(measurement.peak_bytes)} measured, above the cap of {_gib(memory_cap_bytes)}"
        except Exception as error:  # only out-of-memory errors are expected here; the rest re-raise
            if not is_out_of_memory(error):
                raise
            reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
        if reason is not None:
            # Outside the except block, so the error's traceback (and the tensors its frames hold)
            # is gone. A step that fit freed its tensors already (reference counting).
            free_memory(device)
        if reason is None:
            log.info(f"batch size {batch_size}: fits ({_gib(measurement.peak_bytes)} measured)")
        else:
            log.info(f"batch size {batch_size}: does not fit ({reason})")
        return reason is None

    if not fits(start):
        raise ConfigError(
            "batch_size_finder.start",
            f"batch size {start} already does not fit in memory; lower "
            "batch_size_finder.start (1 is the least), raise the memory cap, or "
            "make the step smaller (finetune.input_size, precision=bf16, a smaller model)",
        )
    good, bad = start, None
    while good < max_batch_size:
        candidate = min(good * 2, max_batch_size)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
            break
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    if bad is None:
        # Stopped at the user's cap, not at memory: the margin is for memory, so it does not apply.
        log.info(f"largest batch size searched ({max_batch_size}, {max_batch_size_from}) fits; using it")
        return good
    result = max(1, math.floor(good * safety_margin))
    log.info(f"largest batch size that fits: {good}; using {result} (x{safety_margin} safety margin)")
    return result


def training_step_probe(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    precision: str = "fp32",
    after_train: Callable[[nn.Module], None] | None = None,
    step: Callable[[Any], object] | None = None,
) -> Callable[[int], None]:
    """A try_step for find_batch_size: forward and backward of one training batch of the asked
    size, built by repeating the samples of `batch` (already on the model's device; any nested
    tensors, trainkit.tasks.batches), so shapes and dtypes are the real ones. `step(batch)`, when given,
    is that forward and backward (train.py's: its batch transform, task.step); else, for an (images, labels)
    pair, `loss_fn(model(transform(images)), labels).backward()` under autocast. No optimizer step: the
    weights do not change, and after each try the buffers (BatchNorm statistics), gradients and train/eval
    modes are put back as they were when the probe was made, and torch's RNGs (CPU and the device's;
    dropout and augmentation draw from them) as they were before the try."""
    from trainkit.runtime import autocast

    device = batches.first_tensor(batch).device
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    grads = [(param, None if param.grad is None else param.grad.detach().clone()) for param in model.parameters()]
    modes = [(module, module.training) for module in model.modules()]

    def try_step(batch_size: int) -> None:
        repeated = batches.rows(batch, torch.arange(batch_size, device=device) % batches.samples(batch))
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                model.train()
                if after_train is not None:
                    after_train(model)
                if step is not None:
                    step(repeated)
                    return
                assert loss_fn is not None, "training_step_probe: pass loss_fn or step"
                images, labels = repeated
                with autocast(precision, device):
                    logits = model(transform(images) if transform is not None else images)
                    loss = loss_fn(logits.float(), labels)
                loss.backward()
        finally:
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            for param, grad in grads:
                param.grad = None if grad is None else grad.clone()
            for module, training in modes:
                module.training = training

    return try_step


def _gib(size: int | None) -> str:
    return "n/a" if size is None else readable_size(size)


def readable_size(size: float) -> str:
    """A number of bytes in the unit that shows it with 3 significant digits: 1.50 GiB, 312 MiB, 4.10 KiB
    (never "0.0 MB": a small cap and what it was compared with stay distinguishable)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if size / scale < 1000 else f"{size / scale:.0f} {unit}"
    return f"{size:.0f} bytes"


def find_batch_size_for_run(
    cfg: DictConfig,
    model: nn.Module,
    task: Task,
    loader: TensorLoader | FileLoader,
    step: Callable[[Any], object],
) -> int:
    """`batch_size_finder.*` (cfg) applied to train.py's model (on its device), task, data and training step
    (`step(batch)`: forward and backward of a batch on the device, before its batch transform): the per-process batch
    size to use, the same on every rank (the smallest any rank found). At most this rank's share of
    the training split: a larger batch would repeat no sample, only make one short update an epoch."""
    from trainkit.models.finetune import apply_frozen_bn_eval

    device = next(model.parameters()).device
    batch = task.to_device(next(iter(loader)), device)
    probe = training_step_probe(model, batch, after_train=apply_frozen_bn_eval, step=step)
    cap = None if cfg.memory_cap_gb is None else int(cfg.memory_cap_gb * 2**30)
    max_batch_size, max_batch_size_from = cfg.max_batch_size, "batch_size_finder.max_batch_size"
    share = len(loader.sampler)  # this rank's training samples an epoch: the split / the number of processes
    if share < max_batch_size:
        max_batch_size = share
        max_batch_size_from = f"the training split per process: {share:,} of its {loader.sampler.size:,} samples"
    found = find_batch_size(
        probe,
        start=min(cfg.start, max_batch_size),
        max_batch_size=max_batch_size,
        safety_margin=cfg.safety_margin,
        memory_cap_bytes=cap,
        device=device,
        max_batch_size_from=max_batch_size_from,
    )
    found = min_across_ranks(found, device)  # each rank searched on its own device
    log.info(f"batch size finder: data.batch_size={found} per process")
    return found
