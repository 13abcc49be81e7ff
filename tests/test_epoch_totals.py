"""trainkit.epoch_totals: the epoch's training metrics, summed on the device (one process here)."""

import math

import torch

from trainkit.epoch_totals import EpochTotals

CPU = torch.device("cpu")


def test_means_weigh_samples_the_interval_restarts_and_the_compile_step_is_not_timed():
    totals = EpochTotals(CPU)
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    totals.add(torch.tensor(1.0), logits[:2], torch.tensor([0, 0]))  # one of two right
    assert totals.time_from_here() >= 0  # the first batch (compiled in its step) leaves samples/s
    totals.add(torch.tensor(4.0), logits, torch.tensor([0, 1, 0, 1]))  # four of four right
    assert totals.interval_mean_loss() == 2.5  # the batches' mean, since the start
    totals.add(torch.tensor(float("nan")), logits[:1], torch.tensor([0]))
    assert math.isnan(totals.interval_mean_loss())  # a new interval: only the non-finite batch
    metrics = totals.epoch_metrics()
    assert math.isnan(metrics["train/loss"]) and metrics["train/acc"] == 6 / 7
    assert metrics["train/samples_per_sec"] > 0  # 5 timed samples, the first batch's 2 left out


def test_an_epoch_of_one_finite_batch():
    totals = EpochTotals(CPU)
    totals.add(torch.tensor(0.5), torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1]))
    metrics = totals.epoch_metrics()
    assert metrics["train/loss"] == 0.5 and metrics["train/acc"] == 0.5
