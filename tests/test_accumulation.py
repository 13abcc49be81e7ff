"""Gradient accumulation in train.py's loop: k micro-batches make the same update as one big batch."""
import sys

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT
from trainkit.data import TensorLoader
from trainkit.loggers import Loggers

sys.path.insert(0, str(ROOT))
import train  # noqa: E402


def run_one_epoch(num_samples: int, batch_size: int, accumulate: int) -> tuple[torch.Tensor, int]:
    torch.manual_seed(0)
    images = torch.rand(num_samples, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 3, (num_samples,), generator=torch.Generator().manual_seed(2))
    loader = TensorLoader(images, labels, batch_size, shuffle=True, seed=0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))  # no BatchNorm: batch-size independent
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    cfg = OmegaConf.create({
        "trainer": {"accumulate_grad_batches": accumulate, "limit_train_batches": None, "max_steps": None,
                    "grad_clip": None, "log_every_n_steps": 1000, "checkpoint_every_n_steps": None},
        "precision": {"name": "fp32"},
    })
    _, steps, _ = train.train_one_epoch(
        model, loader, lambda x: x, torch.nn.CrossEntropyLoss(), optimizer, scheduler,
        torch.amp.GradScaler("cpu", enabled=False), cfg, torch.device("cpu"), epoch=0, step=0,
        loggers=Loggers([]), show_progress=False,
    )
    return torch.cat([p.detach().flatten() for p in model.parameters()]), steps


def test_four_micro_batches_of_16_equal_one_batch_of_64():
    big, big_steps = run_one_epoch(64, 64, accumulate=1)
    accumulated, accumulated_steps = run_one_epoch(64, 16, accumulate=4)
    assert big_steps == accumulated_steps == 1
    torch.testing.assert_close(accumulated, big, rtol=1e-5, atol=1e-6)


def test_a_short_last_group_is_averaged_over_its_real_size():
    # 80 samples: one full group of 4x16, then a group of a single micro-batch of 16, which must
    # not be divided by 4 (that would shrink the last update fourfold).
    big, big_steps = run_one_epoch(80, 64, accumulate=1)
    accumulated, accumulated_steps = run_one_epoch(80, 16, accumulate=4)
    assert big_steps == accumulated_steps == 2
    torch.testing.assert_close(accumulated, big, rtol=1e-5, atol=1e-6)


def test_accumulation_counts_updates_not_micro_batches():
    _, steps = run_one_epoch(96, 16, accumulate=2)
    assert steps == 3
