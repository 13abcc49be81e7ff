"""An epoch's training loss, the task's metrics and throughput, summed on the device batch by batch (no host sync per
step) and reduced across ranks only when read: at a logging step (interval_metrics) and at the epoch's end
(epoch_metrics). train/loss is the mean over what the task weighs (`task.weight(batch)`: real tokens or samples);
sized data adds train/<unit>_per_sec (pad_id's units left out) and token data train/padding_fraction. What a task
records (`Task.record`) is logged as train/step_<name> and train/<name>."""

import time
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainkit.tasks.task import Task, first_tensor, samples
from trainkit.tracking.mfu import mfu_metrics  # feature: mfu


class EpochTotals:
    def __init__(
        self, device: torch.device, unit: str | None = None, pad_id: int | None = None, model: nn.Module | None = None
    ) -> None:
        self.device, self.model = device, model  # the model: for what a feature reads of it
        # Summed in place on the device: few small ops a batch, nothing allocated.
        self.loss_sum = torch.zeros((), device=device)
        self.weight_sum = torch.zeros((), device=device)  # what the losses weigh: samples, or real tokens
        self.weight_at_last_update = torch.zeros((), device=device)
        self.metric_sums: torch.Tensor | None = None  # the task's sums; their shape is the task's
        self.interval_loss = torch.zeros((), device=device)  # the batches' mean losses since the last logging step
        # Per recorded name: [value x weight, weight] over the epoch, [value, parts] since the last logging step.
        self.recorded: dict[str, torch.Tensor] = {}
        self.grad_norm: torch.Tensor | None = None  # the last update's, where the loop computed it
        # Known on the host without a sync: batch sizes are shapes.
        self.count = self.untimed_count = self.interval_batches = 0
        # Sized data: real units (on the device) and unit slots (shapes: on the host), and those left untimed.
        self.unit, self.pad_id = unit, pad_id
        self.real_units = torch.zeros((), device=device)
        self.untimed_units = torch.zeros((), device=device)
        self.unit_slots = 0
        self.started = time.perf_counter()

    def add(self, loss: Tensor, metric_sums: Tensor, batch: Any, weight: int | Tensor, recorded: dict) -> None:
        """One batch (or part): `loss` its mean over `weight`; the task's `metric_sums` and `recorded` 0-d tensors."""
        if self.unit:
            self.add_units(first_tensor(batch))
        self.loss_sum += loss * weight
        self.weight_sum += weight
        self.metric_sums = metric_sums.clone() if self.metric_sums is None else self.metric_sums.add_(metric_sums)
        self.count += samples(batch)
        self.interval_loss += loss  # a non-finite loss stays non-finite in the sum: found at the next logging step
        self.interval_batches += 1
        if recorded:
            self.add_recorded(recorded, weight)

    def add_units(self, ids: torch.Tensor) -> None:
        """Sized data: the units of a part's first tensor, those equal to pad_id apart."""
        self.real_units += ids.numel() if self.pad_id is None else (ids != self.pad_id).sum()
        self.unit_slots += ids.numel()

    def add_recorded(self, recorded: dict[str, torch.Tensor], weight: int | torch.Tensor) -> None:
        """What the task recorded in a part's step, summed for the epoch (by `weight`) and the interval."""
        for name, value in recorded.items():
            sums = self.recorded.setdefault(name, torch.zeros(4, device=self.device))
            sums[0] += value * weight
            sums[1] += weight
            sums[2] += value
            sums[3] += 1

    def update_weight(self) -> torch.Tensor:
        """What the batches added since the last call weigh together, on the device; a new count begins."""
        weight = self.weight_sum - self.weight_at_last_update
        self.weight_at_last_update = self.weight_sum.clone()
        return weight

    def time_from_here(self) -> float:
        """Leave the samples so far (compile time) out of train/samples_per_sec; returns the seconds left out."""
        now = time.perf_counter()
        seconds, self.started = now - self.started, now
        self.untimed_count = self.count
        self.untimed_units = self.real_units.clone()
        return seconds

    def interval_metrics(self) -> dict[str, float]:
        """At a logging step, over all ranks (every rank calls it): the means since the last call, and the last
        update's train/grad_norm. A new interval begins."""
        names = ["loss", *sorted(self.recorded)]  # the same order on every rank
        batches = torch.tensor(float(self.interval_batches), device=self.device)
        # Pairs: the loss (then each recorded value) summed since the last call, and its parts.
        sums = torch.cat([torch.stack([self.interval_loss, batches]), *(self.recorded[n][2:] for n in names[1:])])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        grad_norm = [] if self.grad_norm is None else [self.grad_norm.reshape(1).to(sums)]  # the whole model's
        values = torch.cat([sums[0::2] / sums[1::2], sums[1::2], *grad_norm]).tolist()  # means, parts, the norm
        # A name with no part since the last call (recorded earlier in the epoch) has no mean to log.
        metrics = {f"train/step_{name}": mean for name, mean, n in zip(names, values, values[len(names) :]) if n}
        if grad_norm:
            metrics["train/grad_norm"] = values[-1]
        self.interval_loss.zero_()
        self.interval_batches = 0
        for name in names[1:]:
            self.recorded[name][2:] = 0
        return metrics

    def epoch_metrics(self, task: Task) -> dict[str, float]:
        """The epoch's means over every rank's samples (a collective), and the samples a second."""
        metric_sums = self.metric_sums if self.metric_sums is not None else task.empty_metric_sums(self.device)
        local_counts = torch.tensor([self.count, self.untimed_count], dtype=torch.float32, device=self.device)
        unit_counts = torch.stack([self.real_units, self.untimed_units, torch.tensor(float(self.unit_slots))]).float()
        totals = [self.loss_sum.reshape(1), self.weight_sum.reshape(1), local_counts, unit_counts.to(self.device)]
        names = sorted(self.recorded)
        recorded = [self.recorded[name][:2] for name in names]
        # A number from the names, and 1: summed over the ranks, the mean is this rank's number only if all recorded
        # the same names (a sum of one rank's aux and another's temperature would be a number, silently wrong).
        check = torch.tensor([names_number(names), 1.0], device=self.device)
        sums = torch.cat([*totals, *recorded, check, metric_sums])  # promoted, never narrowed
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        loss_sum, weight, count, untimed, real, untimed_real, slots = sums[:7].tolist()
        pairs = sums[7 : 7 + 2 * len(names) + 2].tolist()  # each recorded name's value x weight, weight; the check
        if pairs[-2] / pairs[-1] != names_number(names):
            raise ValueError(
                f"Task.record: the ranks recorded different names (this rank: {names}); every rank must record "
                "the same names in every step"
            )
        seconds = time.perf_counter() - self.started
        metrics = {
            "train/loss": loss_sum / max(weight, 1),
            **{f"train/{name}": value for name, value in task.metrics(sums[9 + 2 * len(names) :]).items()},
            **{
                f"train/{name}": value / max(weight, 1)
                for name, value, weight in zip(names, pairs[0:-2:2], pairs[1:-2:2])
            },
            "train/samples_per_sec": (count - untimed) / seconds,
        }
        if self.unit:
            metrics[f"train/{self.unit}_per_sec"] = (real - untimed_real) / seconds
        if self.unit == "tokens":
            metrics["train/padding_fraction"] = 1 - real / max(slots, 1)
            metrics |= mfu_metrics(metrics, self.model, self.device)  # feature: mfu
        return metrics


def names_number(names: list[str]) -> float:
    return float(zlib.crc32(" ".join(names).encode()) % 4096)  # small: exact in float32 summed over 4,096 ranks
