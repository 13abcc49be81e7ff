"""The start line says when micro-batches split each batch, and that BatchNorm then sees fewer samples; on token
data, that they count tokens and how many sequences a part holds; under several processes, which batch a loss that
couples a batch's samples couples; summary.json records the task's direction of each metric."""

import json
import logging
from types import SimpleNamespace

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from conftest import ROOT
from helpers import template_has
from models_for_tests import NoNormCNN
from tasks_for_tests import InBatchContrastive
from trainkit.models.small_cnn import SmallCNN
from trainkit.run import TrainState
from trainkit.tasks.classification import Classification
from trainkit.tracking.loggers import Loggers
from trainkit.tracking.run_report import training_line, write_summary


def trainer(micro_batch_size):
    return OmegaConf.create({"max_epochs": 2, "max_steps": None, "micro_batch_size": micro_batch_size})


def test_the_start_line_names_the_micro_batches_and_what_batchnorm_sees():
    line = training_line(SmallCNN(1, 10), trainer(16), 5, "cpu", "run", batch_size=64)
    assert "each batch of 64 in micro-batches of 16 (BatchNorm normalizes over 16 samples, not 64)" in line
    assert "BatchNorm" not in training_line(NoNormCNN(1, 10), trainer(16), 5, "cpu", "run", batch_size=64)
    for micro in (None, 64):  # no split
        assert "micro-batches" not in training_line(SmallCNN(1, 10), trainer(micro), 5, "cpu", "run", batch_size=64)


class GatheredContrastive(InBatchContrastive):
    gathers_across_ranks = True


def test_the_start_line_under_several_processes_says_whether_a_coupled_loss_gathers_every_rank_s_batch():
    def line(task, world_size):
        model = NoNormCNN(1, 10)
        return training_line(model, trainer(None), 5, "cpu", "run", batch_size=64, task=task, world_size=world_size)

    per_rank = ", the loss couples each rank's batch of 64 alone, not all 128 samples of the 2 ranks (per rank: "
    assert per_rank in line(InBatchContrastive(10), 2)
    gathered = ", the loss couples all 2 ranks' batches of 64 (gathered across ranks) -> run"
    assert gathered in line(GatheredContrastive(10), 2)
    for task, world_size in ((InBatchContrastive(10), 1), (Classification(3), 2)):  # one process; a loss per sample
        assert "couples" not in line(task, world_size)


def test_one_epoch_is_said_in_the_singular():
    one = OmegaConf.create({"max_epochs": 1, "max_steps": None, "micro_batch_size": None})
    assert " for 1 epoch (5 updates) -> run" in training_line(NoNormCNN(1, 10), one, 5, "cpu", "run")
    assert " for 2 epochs (5 updates each) -> run" in training_line(NoNormCNN(1, 10), trainer(None), 5, "cpu", "run")


@pytest.mark.parametrize(
    "task, test_metrics, direction, ranges",
    [
        (
            Classification(num_classes=3),
            {"test/loss": 0.4, "test/acc": 0.7},
            {"loss": False, "acc": True},
            {"acc": [0, 1], "loss": [0, None]},
        ),
        pytest.param(
            "task/language_model.yaml",
            {"test/loss": 1.9, "test/bpb": 2.7},
            {"loss": False, "bpb": False, "token_acc": True},
            {"bpb": [0, None], "token_acc": [0, 1], "loss": [0, None]},
            marks=pytest.mark.skipif(
                not template_has("task/language_model.yaml"), reason="no language model (trimmed)"
            ),
        ),
    ],
    ids=["classification", "language_model"],
)
def test_summary_json_records_the_tasks_direction_and_range_of_each_metric(
    tmp_path, task, test_metrics, direction, ranges
):
    """What scripts/compare_runs.py ranks by and clips an interval to, without importing the task: higher_is_better
    and metric_ranges by metric name."""
    if isinstance(task, str):  # an option's file: a task a trim may remove, named by its yaml alone
        task = get_class(OmegaConf.load(ROOT / "conf" / task)._target_)()
    run = SimpleNamespace(
        state=TrainState(epoch=1, step=10, best_metrics={"epoch": 0}),
        cfg=OmegaConf.create({"optimized_metric": next(iter(test_metrics)).replace("test/", "val/")}),
        task=task,
        data=SimpleNamespace(fingerprint={}, train=None, val=None),
        proc=SimpleNamespace(world_size=1, is_main=True),
        device="cpu",
        run_dir=tmp_path,
        loggers=Loggers([]),
    )
    write_summary(run, {"epoch": 0}, test_metrics, "max_epochs", 1.0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["higher_is_better"] == direction and summary["metric_ranges"] == ranges


def test_micro_batches_of_token_data_count_tokens_and_a_size_below_a_sequence_is_a_warning(caplog):
    """trainer.micro_batch_size=8 on texts of up to 397 tokens: 8 tokens, so one text a part, 32 passes a batch."""
    with caplog.at_level(logging.WARNING):
        line = training_line(NoNormCNN(1, 10), trainer(8), 5, "cpu", "run", batch_size=32, longest=397)
    assert line.endswith(
        "for 2 epochs (5 updates each), each batch of up to 32 sequences in micro-batches of 8 tokens (a part holds "
        "8 // the batch's padded length sequences, at least 1: 1 of the longest, 397 tokens) -> run"
    )
    assert [record.getMessage() for record in caplog.records] == [
        "trainer.micro_batch_size=8 counts tokens on this data and is below one sequence: a part holds at least one "
        "whole sequence, so a batch of sequences longer than 8 tokens trains one a part (up to 397 tokens each, 32 "
        "forward passes a full batch); the smallest size parts keep to is 397 (the longest sequence): "
        "trainer.micro_batch_size=397 or more"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        line = training_line(NoNormCNN(1, 10), trainer(1600), 5, "cpu", "run", batch_size=32, longest=397)
    assert (
        "micro-batches of 1600 tokens (a part holds 1600 // the batch's padded length sequences, at least 1: 4 " in line
    )
    assert not caplog.records  # at least one longest sequence a part: no warning
    # 32 sequences of at most 128 tokens fit 4096 whole: no split
    assert "micro-batches" not in training_line(
        NoNormCNN(1, 10), trainer(4096), 5, "cpu", "run", batch_size=32, longest=128
    )


def test_the_closing_line_names_the_monitored_metric_that_chose_the_epoch_and_the_others_then(tmp_path, caplog):
    """best.pt is the epoch of the best val/loss (epoch 1) while epoch 0 had the higher val/acc: the line said
    "best val/acc 0.5000 at epoch 1", as if 0.5 were the best val/acc."""
    from trainkit.tasks.classification import Classification

    run = SimpleNamespace(
        state=TrainState(epoch=2, step=20, best_metrics={"epoch": 1, "step": 20, "val/loss": 0.6, "val/acc": 0.5}),
        cfg=OmegaConf.create({"optimized_metric": "val/acc"}),
        task=Classification(num_classes=2),
        early_stopping=SimpleNamespace(monitor="val/loss"),
        data=SimpleNamespace(fingerprint={}, train=None, val=None),
        proc=SimpleNamespace(world_size=1, is_main=True),
        device="cpu",
        run_dir=tmp_path,
        loggers=Loggers([]),
    )
    with caplog.at_level(logging.INFO):
        write_summary(run, {"epoch": 1}, {"test/loss": 0.7, "test/acc": 0.5}, "max_epochs", 1.0)
    assert "test/acc 0.5000 (best epoch 1 by the monitored val/loss 0.6000; val/acc 0.5000 then) ->" in caplog.text
