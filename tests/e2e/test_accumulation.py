"""Gradient accumulation in train.py's loop: k micro-batches make the same update as one big batch, and so do
trainer.micro_batch_size's parts of those."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from conftest import ROOT
from helpers import loop_config
from trainkit.data import DataBundle, TensorLoader
from trainkit.distributed.parallel import DDP
from trainkit.distributed.process_group import ProcessInfo
from trainkit.tasks.classification import Classification

sys.path.insert(0, str(ROOT))
import train


def run_one_epoch(
    num_samples: int, batch_size: int, accumulate: int, micro_batch_size: int | None = None
) -> tuple[torch.Tensor, int]:
    run = one_epoch_run(num_samples, batch_size, accumulate, micro_batch_size)
    train.train_one_epoch(run, show_progress=False)
    return torch.cat([p.detach().flatten() for p in run.model.parameters()]), run.state.step


def one_epoch_run(num_samples: int, batch_size: int, accumulate: int, micro_batch_size: int | None) -> train.Run:
    """train.py's Run of a linear model on random images, ready for train.train_one_epoch."""
    torch.manual_seed(0)
    images = torch.rand(num_samples, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 3, (num_samples,), generator=torch.Generator().manual_seed(2))
    cfg = loop_config(accumulate, micro_batch_size)
    run = train.Run(cfg, Path("unused"), ProcessInfo(), torch.device("cpu"))
    loader = TensorLoader(images, labels, batch_size, shuffle=True, seed=0)
    run.data = DataBundle(loader, loader, loader, channels=1, image_size=4, num_classes=3, mean=(0.0,), std=(1.0,))
    run.model = run.trained_model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))  # no BatchNorm
    run.train_transform = lambda x: x
    run.task = Classification(num_classes=3)
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=0.5)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    return run


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


def test_micro_batches_inside_accumulated_batches_make_the_same_update():
    """trainer.micro_batch_size splits each batch again: the loss scale is part / batch / group size.
    Parts of 6 in batches of 16 (6, 6, 4), 4 batches an update, 80 samples (a short last group of 1):
    the updates of one batch of 64, then of 16."""
    big, big_steps = run_one_epoch(80, 64, accumulate=1)
    split, split_steps = run_one_epoch(80, 16, accumulate=4, micro_batch_size=6)
    assert big_steps == split_steps == 2
    torch.testing.assert_close(split, big, rtol=1e-5, atol=1e-6)


def test_ddp_all_reduces_once_an_update_on_its_last_micro_step():
    """no_sync() around every forward and backward but the last of an update. A real DDP in this process
    (a process group of one, gloo): its comm hook runs exactly when DDP all-reduces the gradients. 80 samples in
    batches of 16, 2 batches an update, each batch in parts of 8: updates after batches 1, 3 and 4 (a short group)."""
    events: list[str] = []

    def counting_allreduce(state, bucket):
        events.append("all-reduce")
        return allreduce_hook(state, bucket)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run = one_epoch_run(80, 16, accumulate=2, micro_batch_size=8)
        run.model.register_forward_pre_hook(lambda module, inputs: events.append("forward"))
        run.parallel = DDP("fp32", True, torch.device("cpu"))  # what train.py chooses for several processes
        run.trained_model = run.parallel.wrap(run.model)
        run.trained_model.register_comm_hook(None, counting_allreduce)
        train.train_one_epoch(run, show_progress=False)
    finally:
        dist.destroy_process_group()
    no_update, update = ["forward"] * 2, ["forward", "forward", "all-reduce"]  # a batch: 2 parts
    assert events == no_update + update + no_update + update + update and run.state.step == 3
