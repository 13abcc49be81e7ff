"""Model FLOPs utilization (the mfu feature, docs/features.md): the GPT's FLOPs a token, train/mfu for an epoch's
tokens a second on a known GPU, none elsewhere, and its part of the epoch line."""

import pytest
import torch

from trainkit.models.gpt import GPT
from trainkit.tasks.classification import Classification
from trainkit.tracking import epoch_totals, mfu
from trainkit.tracking.epoch_totals import EpochTotals
from trainkit.tracking.mfu import flops_per_token, mfu_metrics, model_flops_utilization
from trainkit.tracking.run_report import throughput


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32)


def test_flops_a_token_follow_nanogpts_estimate_and_mfu_is_for_cuda_alone():
    model = tiny()
    non_embedding = sum(p.numel() for p in model.parameters()) - 32 * 32
    assert flops_per_token(model) == 6 * non_embedding + 12 * 2 * 2 * 16 * 32
    assert model_flops_utilization(1e6, flops_per_token(model), torch.device("cpu")) is None


def test_an_epoch_of_tokens_on_a_known_gpu_gets_train_mfu_per_gpu_and_other_epochs_none(monkeypatch):
    monkeypatch.setattr(mfu.torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(mfu.torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(mfu.torch.distributed, "get_world_size", lambda: 2)
    model, cuda = tiny(), torch.device("cuda")
    epoch = {"train/loss": 1.0, "train/tokens_per_sec": 2e6}
    expected = 1e6 * flops_per_token(model) / 989e12  # two GPUs share the tokens
    assert mfu_metrics(epoch, model, cuda) == {"train/mfu": pytest.approx(expected)}
    assert mfu_metrics(epoch, model, torch.device("cpu")) == {}
    assert mfu_metrics({"train/samples_per_sec": 10.0}, model, cuda) == {}
    assert mfu_metrics(epoch, torch.nn.Linear(2, 2), cuda) == mfu_metrics(epoch, None, cuda) == {}


def test_an_epoch_of_token_data_reports_what_mfu_metrics_says_of_the_model_it_was_given(monkeypatch):
    """EpochTotals' marked line: the epoch's metrics, its model and device go to mfu_metrics (no GPU here)."""
    seen = []
    monkeypatch.setattr(epoch_totals, "mfu_metrics", lambda *args: seen.append(args) or {"train/mfu": 0.5})
    model, task = tiny(), Classification(num_classes=2)
    totals = EpochTotals(torch.device("cpu"), unit="tokens", pad_id=0, model=model)
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 0]])
    totals.add(torch.tensor(1.0), task.metric_sums(torch.zeros(2, 2), torch.tensor([0, 1])), (ids, ids[:, 0]), 2, {})
    assert totals.epoch_metrics(task)["train/mfu"] == 0.5
    assert seen[0][1:] == (model, torch.device("cpu")) and "train/tokens_per_sec" in seen[0][0]


def test_the_epoch_line_shows_train_mfu_after_the_tokens_a_second():
    assert throughput({"train/tokens_per_sec": 12345.0, "train/mfu": 0.4321}) == "12,345 tokens/s  mfu 43.2%"
    assert throughput({"train/tokens_per_sec": 12345.0}) == "12,345 tokens/s"
