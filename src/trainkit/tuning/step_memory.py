"""What a training step costs in memory, and whether it fit: what the batch-size finder (batch_size_finder) and
trainer.micro_batch_size=auto (micro_batching) search with. It is batch_size_finder's (docs/features.md), so
micro_batch_auto needs that row: dropping the finder drops both.

    probe = training_step_probe(model, batch, step)   # step(batch): forward and backward (train.py's)
    with measure_step_memory(device) as measured:
        probe(16)                                     # 16 samples of `batch`, repeated; the model left as it was
    measured.peak_bytes

"Does not fit": an out-of-memory error (is_out_of_memory) or measured memory above the search's cap. On CUDA that is
the allocator's peak; elsewhere the bytes autograd saves for backward (the part that grows with the batch).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from trainkit.tasks.task import first_tensor, rows, samples


class MemoryCapExceeded(RuntimeError):
    """A step used more memory than the configured cap (treated like an out-of-memory error)."""


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (MemoryCapExceeded, torch.cuda.OutOfMemoryError)):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in message or "can't allocate memory" in message)


def free_memory(device: torch.device | str | None = None) -> None:
    """Drop what a failed step left behind on an accelerator: Python garbage, then CUDA's cached blocks."""
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


def try_size(
    try_step: Callable[[int], None], size: int, device: torch.device | str | None, cap: int | None
) -> tuple[str | None, int | None]:
    """`try_step(size)` on this rank: why it did not fit (None where it did), and the peak it measured in bytes."""
    reason, measurement = None, _Measurement()
    try:
        with measure_step_memory(device) as measurement:
            try_step(size)
        if cap is not None and measurement.peak_bytes is not None and measurement.peak_bytes > cap:
            reason = f"{readable_size(measurement.peak_bytes)} measured, above the cap of {readable_size(cap)}"
    except Exception as error:  # out of memory is expected here; anything else is a real error
        if not is_out_of_memory(error):
            raise
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
    if reason is not None:
        free_memory(device)  # outside the except block: the traceback's frames (and tensors) are gone
    return reason, measurement.peak_bytes


def training_step_probe(model: nn.Module, batch: Any, step: Callable[[Any], object]) -> Callable[[int], None]:
    """A try_step for find_batch_size: `step(batch)` (forward and backward) on `batch`'s samples repeated to the asked
    size. No optimizer step; after each try buffers, gradients, modes and torch's RNGs are put back."""
    device = first_tensor(batch).device
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    grads = [(param, None if param.grad is None else param.grad.detach().clone()) for param in model.parameters()]
    modes = [(module, module.training) for module in model.modules()]

    def try_step(batch_size: int) -> None:
        repeated = rows(batch, torch.arange(batch_size, device=device) % samples(batch))
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                model.train()
                step(repeated)
        finally:
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            for param, grad in grads:
                param.grad = None if grad is None else grad.clone()
            for module, training in modes:
                module.training = training

    return try_step


def readable_size(size: float) -> str:
    """A number of bytes with 3 significant digits: 1.50 GiB, 312 MiB, 4.10 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if size / scale < 1000 else f"{size / scale:.0f} {unit}"
    return f"{size:.0f} bytes"
