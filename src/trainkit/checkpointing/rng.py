"""Every random stream a run draws from (Python, NumPy, torch on the CPU, each CUDA device), as plain containers that
load with torch.load(weights_only=True), and their restore, after which the next draws are those the snapshot would
have made. (torch.random.fork_rng covers torch and CUDA only, not Python's `random` or NumPy.)"""

import random

import numpy as np
import torch

from trainkit.runtime import seed_everything


def rng_states() -> dict:
    """Every random stream a resumed run needs to continue exactly. The layout is part of the checkpoint format (old
    checkpoints must keep loading): python: MT state words + [gauss cache], python_version, numpy: key words + [pos,
    has_gauss, cached_gaussian], torch: ByteTensor, cuda: [ByteTensor per device] (empty without CUDA)."""
    python_version, python_state, gauss = random.getstate()
    numpy_state = np.random.get_state()
    assert isinstance(numpy_state, tuple)  # legacy=True (the default): the global MT19937's state tuple
    return {
        "python": [*python_state, gauss],
        "python_version": python_version,
        "numpy": numpy_state[1].tolist() + list(numpy_state[2:]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(state: dict) -> None:
    """Put back what rng_states() took (from this process, or loaded from a checkpoint)."""
    python = state["python"]
    random.setstate((state["python_version"], tuple(python[:-1]), python[-1]))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", np.array(numpy[:624], dtype=np.uint32), *numpy[624:]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rank_rng_states(streams: list, rank: int, world_size: int, reseed: int) -> None:
    """This rank's streams from a checkpoint's list (one entry per rank, in rank order); when the run
    now has another number of ranks, fresh streams seeded with `reseed`, still distinct per rank."""
    if len(streams) == world_size:
        restore_rng_states(streams[rank])
    else:
        seed_everything(reseed)
