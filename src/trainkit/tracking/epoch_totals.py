"""An epoch's training loss, the task's metrics and throughput, summed on the device batch by batch
(no host sync per step) and reduced across ranks only when read: at a logging step and at the
epoch's end.

    totals = EpochTotals(device)           # before the loop: samples/s is timed from here
    totals.add(loss.detach(), task.metric_sums(outputs.detach(), targets), len(targets))   # each batch
    totals.interval_mean_loss()            # a logging step, on every rank: the mean since the last one
    totals.epoch_metrics(task)             # after the loop: train/loss, train/<metric>, train/samples_per_sec
"""

import time

import torch

from trainkit.distributed.process_group import all_reduce_sum
from trainkit.tasks.task import Task


class EpochTotals:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        # On the device, summed in place: few small ops a batch, nothing allocated for the sums.
        self.loss_sum = torch.zeros((), device=device)
        self.metric_sums: torch.Tensor | None = None  # the task's sums; their shape is the task's
        self.interval_loss = torch.zeros((), device=device)  # the batches' mean losses since the last logging step
        # Known on the host without a sync: batch sizes are shapes.
        self.count = self.untimed_count = self.interval_batches = 0
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, metric_sums: torch.Tensor, size: int) -> None:
        """One batch of `size` samples: `loss` is its mean, `metric_sums` the task's sums for it."""
        self.loss_sum += loss * size
        if self.metric_sums is None:
            self.metric_sums = metric_sums.clone()
        else:
            self.metric_sums += metric_sums
        self.count += size
        self.interval_loss += loss  # a non-finite loss stays non-finite in the sum: found at the next logging step
        self.interval_batches += 1

    def time_from_here(self) -> float:
        """Leave the samples so far out of train/samples_per_sec (torch.compile compiled in their
        step) and time from now on; returns the seconds left out."""
        now = time.perf_counter()
        seconds, self.started = now - self.started, now
        self.untimed_count = self.count
        return seconds

    def interval_mean_loss(self) -> float:
        """The mean batch loss since the last call, over all ranks (a collective: every rank calls it
        at the same step; one host sync), and a new interval begins."""
        batches = torch.tensor(float(self.interval_batches), device=self.device)
        loss_sum, count = all_reduce_sum(torch.stack([self.interval_loss, batches]))
        mean = (loss_sum / count).item()
        self.interval_loss.zero_()
        self.interval_batches = 0
        return mean

    def epoch_metrics(self, task: Task) -> dict[str, float]:
        """The epoch's means over every rank's samples (a collective), and the samples a second."""
        metric_sums = self.metric_sums if self.metric_sums is not None else task.empty_metric_sums(self.device)
        local_counts = torch.tensor([self.count, self.untimed_count], dtype=torch.float32, device=self.device)
        sums = all_reduce_sum(torch.cat([self.loss_sum.reshape(1), local_counts, metric_sums.float()]))
        loss_sum, count, untimed = sums[:3].tolist()
        return {
            "train/loss": loss_sum / max(count, 1),
            **{f"train/{name}": value for name, value in task.metrics(sums[3:]).items()},
            "train/samples_per_sec": (count - untimed) / (time.perf_counter() - self.started),
        }
