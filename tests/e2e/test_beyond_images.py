"""Beyond images on one loop: a table with float targets trains end to end (its targets untouched, no batch
transform, no image logging), the task's own headline metric is what is optimized and monitored by
default, and eval.py writes a vector per sample as a row."""

import torch

from conftest import composed
from helpers import record_run, template_has
from trainkit.config.validation import validate

TABLE_RUN = (
    "device=cpu",
    "print_config=false",
    "data._target_=data_for_tests.DigitsTable",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "data.num_classes=1",  # one output: the number
    "~model",
    "+model._target_=models_for_tests.TableNet",
    "+model.in_features=64",
    "+model.num_classes=1",
    "~task",
    "+task._target_=tasks_for_tests.Regression",
    *(["logger.log_images=true"] if template_has("logger.log_images") else []),  # a grid once crashed on a table
    "regularization=none",
    "trainer.max_epochs=2",
    "optimizer.lr=0.01",
)


def test_a_table_with_float_targets_trains_and_is_tested_by_its_own_metric(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *TABLE_RUN)
    targets = torch.cat([targets for _, targets, _ in recording.losses])
    assert targets.dtype == torch.float32 and (targets.frac() == 0.25).all()  # not cast to int64
    assert all(torch.equal(images, transformed) for images, transformed in recording.transformed)  # no transform
    summary = recording.summary
    assert summary["optimized_metric"] == "val/mae" and summary["optimized_value"] == summary["best"]["val/mae"]
    assert summary["test"]["test/mae"] < 2.5  # better than a constant guess of the median digit
    assert not (tmp_path / "train_samples.png").exists()  # image logging is for images


def test_the_monitor_and_optimized_metric_default_to_the_tasks_own_metrics():
    # A task that names no monitored_metric is stopped by its headline metric, under any regularization option
    # (regularization=default's monitor was a fixed val/loss, which a task's yaml could not change).
    table = [override for override in TABLE_RUN if not override.startswith("regularization=")]
    for regularization in ("default", "strong", "none"):
        regression = composed(*table, f"regularization={regularization}")
        validate(regression)
        assert regression.optimized_metric == "val/mae"
        assert regression.regularization.early_stopping.monitor == "val/mae"
        assert regression.regularization.early_stopping.mode == "min"
    assert composed().optimized_metric is None  # the default: filled in from the task by validate
    classification = composed()
    validate(classification)
    assert classification.optimized_metric == "val/acc"
    assert classification.regularization.early_stopping.monitor == "val/loss"  # the default run's, as before
    overridden = composed(*TABLE_RUN, "regularization.early_stopping.monitor=val/loss")
    validate(overridden)
    assert overridden.regularization.early_stopping.monitor == "val/loss"  # a monitor named is kept
