"""Where and how the math runs: the device, seeding, mixed precision, TF32, cuDNN autotuning, deterministic kernels."""

import contextlib
import logging
import os
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from trainkit.distributed.process_group import process_info
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")
_warned_slow_fp16 = False  # once per process: training and evaluation each build an autocast
# The loader rules' worker counts (docs/speed.md#the-loader-rules): from the cores, raise by 1.5x, at most 2x the cores.
RAISE = 1.5
MAX_WORKERS_PER_CORE = 2


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask, since the machine's count over-counts on shared nodes."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask


def cores_per_rank(cores: int, local_ranks: int = 1) -> int:
    """A rank's share of `cores` when `local_ranks` ranks run on this node, at least 1."""
    return max(1, cores // max(local_ranks, 1))


def this_rank_cores() -> int:
    """The cores this rank may use: its affinity mask shared among the ranks of this node."""
    return cores_per_rank(available_cores(), process_info().local_world_size)


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` prefers CUDA (the local GPU), then MPS, then the CPU. Whether the device exists is checked here."""
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


def set_math_modes(tf32: bool, cudnn_benchmark: bool, device: torch.device, deterministic: bool = False) -> None:
    """`tf32`: fp32 matmuls and convolutions on TF32 tensor cores. `cudnn_benchmark`: cuDNN picks the fastest algorithm
    per shape, which can differ between runs. `deterministic`: deterministic kernels only (cudnn_benchmark then off).
    Set per process before the first CUDA op, and logged once on CUDA."""
    if deterministic:
        # cuBLAS is deterministic only with a fixed workspace (CUDA >= 10.2); a value set by the user is kept.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if cudnn_benchmark and device.type == "cuda" and process_info().is_main:
            log.warning("trainer.cudnn_benchmark=true is ignored: trainer.deterministic=true turns it off")
        cudnn_benchmark = False
    torch.use_deterministic_algorithms(deterministic)  # also when false: a process may train twice (tests, sweeps)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark
    if device.type == "cuda" and process_info().is_main:
        log.info(
            f"CUDA math: TF32 matmul/convolutions {'on' if tf32 else 'off (IEEE fp32)'} (precision.tf32), "
            f"cudnn.benchmark {'on' if cudnn_benchmark else 'off'} (trainer.cudnn_benchmark), "
            f"deterministic algorithms {'on' if deterministic else 'off'} (trainer.deterministic)"
        )


@contextlib.contextmanager
def nondeterministic_op_errors() -> Iterator[None]:
    """Turn torch's error for an op without a deterministic kernel into one line naming trainer.deterministic."""
    try:
        yield
    except RuntimeError as error:
        if not torch.are_deterministic_algorithms_enabled() or "deterministic" not in str(error):
            raise
        what = str(error).strip().splitlines()[0].split(", but you set")[0]  # "<op> does not have a deterministic ..."
        raise ConfigError(
            "trainer.deterministic", f"{what}; set trainer.deterministic=false, or use another op there"
        ) from error


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast for bf16/fp16; a no-op for fp32. Reusable, but not inside itself. fp16 on a CPU is emulated (slow),
    which rank 0 says once."""
    global _warned_slow_fp16
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type == "cpu" and not _warned_slow_fp16 and process_info().is_main:
        log.warning(
            "precision=fp16 on the CPU is emulated and runs many times slower than fp32; "
            "use precision=bf16 (native on recent CPUs) or fp32"
        )
        _warned_slow_fp16 = True
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling is needed for fp16 only (bf16 has fp32's range); disabled, it passes through. fp16's scaler skips
    updates whose gradients overflow, often the first, yet the schedule steps: PyTorch's warning of that is silenced."""
    if precision == "fp16":
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
