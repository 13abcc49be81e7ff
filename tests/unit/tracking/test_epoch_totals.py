"""trainkit.tracking.epoch_totals: the epoch's training metrics, summed on the device (one process here)."""

import math
from types import SimpleNamespace

import pytest
import torch

from trainkit.tasks.classification import Classification
from trainkit.tracking import epoch_totals
from trainkit.tracking.epoch_totals import EpochTotals

CPU = torch.device("cpu")
TASK = Classification(num_classes=2)


def part(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of `samples` (inputs, labels): what EpochTotals counts of it is its samples."""
    return torch.zeros(samples, 2), torch.zeros(samples, dtype=torch.long)


def sums(logits: torch.Tensor, labels: list[int]) -> torch.Tensor:
    return TASK.metric_sums(logits, torch.tensor(labels))


def test_means_weigh_samples_the_interval_restarts_and_the_compile_step_is_not_timed(monkeypatch):
    clock = {"now": 100.0}  # seconds, moved by the test
    monkeypatch.setattr(epoch_totals.time, "perf_counter", lambda: clock["now"])
    totals = EpochTotals(CPU)
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    totals.add(torch.tensor(1.0), sums(logits[:2], [0, 0]), part(2), 2, {})  # one of two right
    clock["now"] += 30  # compile + the first step
    assert totals.time_from_here() == 30  # the first batch (compiled in its step) leaves samples/s
    totals.add(torch.tensor(4.0), sums(logits, [0, 1, 0, 1]), part(4), 4, {})  # four of four right
    assert totals.interval_metrics() == {"train/step_loss": 2.5}  # the batches' mean, since the start
    totals.add(torch.tensor(float("nan")), sums(logits[:1], [0]), part(1), 1, {})
    assert math.isnan(totals.interval_metrics()["train/step_loss"])  # a new interval: only the non-finite batch
    clock["now"] += 2
    metrics = totals.epoch_metrics(TASK)
    assert math.isnan(metrics["train/loss"]) and metrics["train/acc"] == 6 / 7
    assert metrics["train/samples_per_sec"] == 5 / 2  # 5 samples in 2 s: the first batch's 2 and 30 s left out


def test_an_epoch_of_one_finite_batch():
    totals = EpochTotals(CPU)
    totals.add(torch.tensor(0.5), sums(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), [0, 1]), part(2), 2, {})
    metrics = totals.epoch_metrics(TASK)
    assert metrics["train/loss"] == 0.5 and metrics["train/acc"] == 0.5


def test_throughput_counts_the_data_s_size_unit_tokens_without_padding_and_signals_frames(monkeypatch):
    """train/<unit>_per_sec follows Data.size_unit: text's real tokens (pad_id left out, with the padded share), a
    dict batch of signals' frames (the padded signal's elements: its zeros may be real), images none."""
    clock = {"now": 0.0}
    monkeypatch.setattr(epoch_totals.time, "perf_counter", lambda: clock["now"])
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 0]])  # 5 real tokens of 8 slots, 0 pads
    text = EpochTotals(CPU, unit="tokens", pad_id=0)
    text.add(torch.tensor(1.0), sums(torch.zeros(2, 2), [0, 1]), (ids, torch.tensor([0, 1])), 2, {})
    signals = {"signal": torch.rand(3, 10), "lengths": torch.tensor([10, 4, 7]), "targets": torch.tensor([0, 1, 1])}
    frames, images = EpochTotals(CPU, unit="frames"), EpochTotals(CPU)
    for totals in (frames, images):
        totals.add(torch.tensor(1.0), sums(torch.zeros(3, 2), [0, 1, 1]), signals, 3, {})
    clock["now"] += 2
    text_metrics, frame_metrics, image_metrics = (totals.epoch_metrics(TASK) for totals in (text, frames, images))
    assert text_metrics["train/tokens_per_sec"] == 5 / 2 and text_metrics["train/padding_fraction"] == 3 / 8
    assert frame_metrics["train/frames_per_sec"] == 30 / 2 and frame_metrics["train/samples_per_sec"] == 3 / 2
    assert "train/padding_fraction" not in frame_metrics and "train/tokens_per_sec" not in frame_metrics
    assert sorted(image_metrics) == ["train/acc", "train/loss", "train/samples_per_sec"]


def test_the_tasks_metric_sums_keep_their_dtype_as_evaluation_keeps_them():
    class SumOfSquares(Classification):  # float64 sums, as an R^2 from sums of squares needs
        def metric_sums(self, outputs, targets):
            return torch.tensor([2.0**24 + 1, 1.0], dtype=torch.float64)  # float32 would round it to 2**24

        def metrics(self, sums):
            return {"sum": sums[0].item(), "dtype": str(sums.dtype)}

    totals = EpochTotals(CPU)
    totals.add(torch.tensor(0.5), SumOfSquares(2).metric_sums(None, None), part(2), 2, {})
    metrics = totals.epoch_metrics(SumOfSquares(2))
    assert metrics["train/sum"] == 2.0**24 + 1 and metrics["train/dtype"] == "torch.float64"


def test_recorded_values_are_step_means_and_epoch_means_by_weight():
    """Three parts weighing 2, 4 and 1 record aux; the second also records temperature. A logging step after the
    first two reports each name's plain mean over its parts (as train/step_loss), the epoch its mean by weight."""
    totals = EpochTotals(CPU)
    logits = torch.zeros(4, 2)
    totals.add(torch.tensor(1.0), sums(logits[:2], [0, 0]), part(2), 2, {"aux": torch.tensor(0.5)})
    recorded = {"aux": torch.tensor(2.0), "temperature": torch.tensor(0.07)}
    totals.add(torch.tensor(1.0), sums(logits, [0, 0, 1, 1]), part(4), 4, recorded)
    totals.grad_norm = torch.tensor(3.0)
    step = totals.interval_metrics()
    assert step["train/step_aux"] == (0.5 + 2.0) / 2 and step["train/grad_norm"] == 3.0
    assert step["train/step_temperature"] == pytest.approx(0.07)
    totals.add(torch.tensor(1.0), sums(logits[:1], [0]), part(1), 1, {"aux": torch.tensor(4.0)})
    assert "train/step_temperature" not in totals.interval_metrics()  # not recorded since the last logging step
    epoch = totals.epoch_metrics(TASK)
    assert epoch["train/aux"] == pytest.approx((0.5 * 2 + 2.0 * 4 + 4.0 * 1) / 7)
    assert epoch["train/temperature"] == pytest.approx(0.07)


@pytest.mark.parametrize("other_rank_records", ["aux", "temperature"])
def test_ranks_that_recorded_different_names_are_refused_not_summed(monkeypatch, other_rank_records):
    """Two ranks, simulated: the other rank's reduced tensor is added to this one's. With the same name the epoch's
    mean is over both ranks; with another name of the same length the sum would mix aux with temperature."""
    sent: list[torch.Tensor] = []

    def all_reduce(tensor: torch.Tensor) -> None:  # the other rank reduces first and keeps its own sums
        if not sent:
            sent.append(tensor.clone())
        else:
            tensor += sent.pop()

    ranks = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, all_reduce=all_reduce)
    monkeypatch.setattr(epoch_totals, "dist", ranks)
    other, this = EpochTotals(CPU), EpochTotals(CPU)
    for totals, name in ((other, other_rank_records), (this, "aux")):
        totals.add(torch.tensor(1.0), sums(torch.zeros(2, 2), [0, 1]), part(2), 2, {name: torch.tensor(3.0)})
    other.epoch_metrics(TASK)
    if other_rank_records == "aux":
        assert this.epoch_metrics(TASK)["train/aux"] == 3.0
    else:
        with pytest.raises(ValueError, match=r"the ranks recorded different names \(this rank: \['aux'\]\)"):
            this.epoch_metrics(TASK)
