"""Device choice, seeding and mixed precision."""

import logging
import os
import random

import numpy as np
import pytest
import torch

from trainkit import runtime
from trainkit.errors import ConfigError
from trainkit.runtime import autocast, cores_per_rank, grad_scaler, pick_device, seed_everything

CPU = torch.device("cpu")
no_accelerator = pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.mps.is_available(), reason="checks the CPU-only fallback"
)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is missing")


@no_accelerator
def test_auto_picks_the_cpu_without_an_accelerator():
    assert pick_device("auto") == CPU
    assert pick_device("auto", local_rank=3) == CPU


def test_cpu_is_always_available():
    assert pick_device("cpu") == CPU


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_raises_config_error_naming_device(name):
    with pytest.raises(ConfigError) as error:
        pick_device(name)
    assert error.value.key == "device"
    assert name in str(error.value) and "device=cpu" in str(error.value)


# A name that is not a device (gpu, cuda:x) is the schema's to report: tests/unit/config/test_config.py.


def draws() -> tuple:
    return random.random(), np.random.rand(), torch.rand(2).tolist(), torch.nn.Linear(2, 2).weight.tolist()


def test_seed_everything_makes_draws_repeat():
    seed_everything(7)
    first = draws()
    seed_everything(7)
    assert draws() == first
    seed_everything(8)
    assert draws() != first


def test_seed_everything_accepts_seeds_beyond_numpy_range():
    seed_everything(2**32 + 5)  # numpy only takes 32-bit seeds
    first = draws()
    seed_everything(2**32 + 5)
    assert draws() == first


def matmul_dtype(precision: str) -> torch.dtype:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(precision, CPU):
        return (a @ b).dtype


def test_fp32_autocast_is_a_no_op():
    with autocast("fp32", CPU):
        assert not torch.is_autocast_enabled("cpu")
    assert matmul_dtype("fp32") == torch.float32


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16():
    assert matmul_dtype("bf16") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")  # switched off again on exit


def test_fp16_autocast_uses_float16(monkeypatch):
    monkeypatch.setattr(runtime, "_warned_slow_fp16", False)  # its warning stays due for later runs in this process
    with autocast("fp16", CPU):
        assert torch.get_autocast_dtype("cpu") == torch.float16


@pytest.mark.parametrize("precision, rank, warned", [("fp16", "0", 1), ("bf16", "0", 0), ("fp16", "1", 0)])
def test_fp16_on_the_cpu_warns_once_that_it_is_slow(caplog, monkeypatch, precision, rank, warned):
    """fp16 autocast on a CPU is emulated (about 13x slower than fp32 for the small CNN); autocast is
    built for every batch, so the warning comes once per process, and names the way out."""
    monkeypatch.setattr(runtime, "_warned_slow_fp16", False)
    monkeypatch.setenv("RANK", rank)  # rank 0 alone says it
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.WARNING, logger="trainkit.runtime"):
        for _ in range(3):
            with autocast(precision, CPU):
                pass
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == warned and all("precision=bf16" in m for m in messages), messages


@pytest.mark.parametrize("precision, enabled", [("fp32", False), ("bf16", False), ("fp16", True)])
def test_grad_scaler_is_enabled_for_fp16_only(precision, enabled):
    assert grad_scaler(precision, CPU).is_enabled() is enabled


def test_disabled_grad_scaler_passes_the_loss_through():
    loss = torch.tensor(2.5)
    assert grad_scaler("bf16", CPU).scale(loss) is loss


@pytest.mark.parametrize("tf32, autotune", [(True, False), (False, True)])
def test_math_modes_set_tf32_and_cudnn_benchmark_from_the_config(tf32, autotune):
    from trainkit.runtime import set_math_modes

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        set_math_modes(tf32, autotune, torch.device("cpu"))
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        assert torch.backends.cudnn.benchmark is autotune
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def test_deterministic_switch_sets_torch_and_cublas_and_overrides_cudnn_benchmark(monkeypatch, caplog):
    from trainkit.runtime import set_math_modes

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        with caplog.at_level("WARNING"):
            set_math_modes(False, True, torch.device("cuda"), deterministic=True)  # sets flags only: no GPU needed
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert torch.backends.cudnn.benchmark is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
            "trainer.cudnn_benchmark=true is ignored: trainer.deterministic=true turns it off"
        ]
    finally:
        set_math_modes(True, True, torch.device("cpu"))  # the defaults: later tests start from them
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


def test_nondeterministic_op_error_becomes_one_line_naming_the_switch():
    from trainkit.runtime import nondeterministic_op_errors

    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(ConfigError) as error, nondeterministic_op_errors():
            raise RuntimeError("scatter_add_cuda_kernel does not have a deterministic implementation, but you set ...")
        assert error.value.key == "trainer.deterministic"
        assert str(error.value).startswith("trainer.deterministic: scatter_add_cuda_kernel does not have a determ")
        with pytest.raises(RuntimeError, match="out of memory"), nondeterministic_op_errors():
            raise RuntimeError("CUDA out of memory")  # other errors pass through as they are
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    "cores, local_ranks, expected",
    [
        (8, 1, 8),  # the articles: 8 cores, 8 workers
        (12, 1, 12),
        (32, 1, 32),  # no cap below the cores
        (1, 1, 1),
        (16, 2, 8),  # the cores are shared among the ranks of this node
        (16, 8, 2),
        (9, 2, 4),
        (4, 8, 1),  # fewer cores than ranks: still one each (decoding then overlaps the step)
    ],
)
def test_auto_is_1x_the_cores_of_this_rank_at_least_1(cores, local_ranks, expected):
    assert cores_per_rank(cores, local_ranks) == expected
