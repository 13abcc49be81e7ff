"""Where and how the math runs: device choice, seeding, mixed precision."""

import contextlib
import random
from typing import Any

import numpy as np
import torch

from trainkit.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` prefers CUDA (this process's local GPU), then Apple's MPS, then the CPU. The name's
    form is checked by trainkit.config; whether that device exists here is checked now."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", f"'{name}' asked for, but no CUDA GPU is visible; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device", "'mps' asked for, but MPS is not available here; use device=auto or device=cpu")
    return device


def seed_everything(seed: int) -> None:
    """Seed every generator this process uses. Call it inside each worker process."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast for bf16/fp16; a no-op context for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling is needed for fp16 only (bf16 has fp32's range); disabled, it passes through."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
