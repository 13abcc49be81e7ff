"""An epoch's training loss, accuracy and throughput, summed on the device batch by batch (no host
sync per step) and reduced across ranks only when read: at a logging step and at the epoch's end.

    totals = EpochTotals(device)           # before the loop: samples/s is timed from here
    totals.add(loss.detach(), logits.detach(), labels)       # each batch
    totals.interval_mean_loss()            # a logging step, on every rank: the mean since the last one
    totals.epoch_metrics()                 # after the loop: train/loss, train/acc, train/samples_per_sec
"""

import time

import torch

from trainkit.distributed import all_reduce_sum


class EpochTotals:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        # On the device, summed in place: few small ops a batch, nothing allocated for the sums.
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device)
        self.interval_loss = torch.zeros((), device=device)  # the batches' mean losses since the last logging step
        # Known on the host without a sync: batch sizes are shapes.
        self.count = self.untimed_count = self.interval_batches = 0
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """One batch: `loss` is its mean; accuracy counts against the hard labels (also under MixUp)."""
        size = labels.numel()
        self.loss_sum += loss * size
        self.correct += (logits.argmax(dim=1) == labels).sum()
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

    def epoch_metrics(self) -> dict[str, float]:
        """The epoch's means over every rank's samples (a collective), and the samples a second."""
        local_counts = torch.tensor([self.count, self.untimed_count], dtype=torch.float32, device=self.device)
        sums = torch.cat([torch.stack([self.loss_sum, self.correct]), local_counts])
        loss_sum, correct, count, untimed = all_reduce_sum(sums).tolist()
        return {
            "train/loss": loss_sum / max(count, 1),
            "train/acc": correct / max(count, 1),
            "train/samples_per_sec": (count - untimed) / (time.perf_counter() - self.started),
        }
