"""Put back everything a few trial steps change: the LR range test trains for real, then leaves
model, optimizer, scheduler, GradScaler and every RNG exactly as it found them.

    with preserved_training_state(model, optimizer, scheduler, grad_scaler):
        ...   # any number of forward/backward/optimizer steps
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from trainkit.checkpointing.rng import restore_rng_states, rng_states


def _copy_to_cpu(value: Any) -> Any:
    """A deep copy with every tensor cloned to the CPU (keeps device memory free)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _copy_to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_to_cpu(item) for item in value)
    return value


@contextmanager
def preserved_training_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> Iterator[None]:
    """Everything a few trial steps change, put back bit for bit on exit (even after an error):
    the model's state dict, gradients and train/eval modes, the optimizer's state and param
    groups, the scheduler's and GradScaler's state, and the Python, NumPy, torch and CUDA RNGs.
    (Non-persistent buffers are not in a state dict: they are assumed to be constants.)"""
    model_state = _copy_to_cpu(model.state_dict())
    grads = [(p, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
    modes = [(module, module.training) for module in model.modules()]
    states = [
        (part, _copy_to_cpu(part.state_dict())) for part in (optimizer, scheduler, grad_scaler) if part is not None
    ]
    rng = rng_states()
    try:
        yield
    finally:
        model.load_state_dict(model_state)
        for param, grad in grads:
            param.grad = grad
        for module, training in modes:
            module.training = training
        for part, state in states:  # optimizer, scheduler, GradScaler: those given
            part.load_state_dict(state)
        restore_rng_states(rng)
