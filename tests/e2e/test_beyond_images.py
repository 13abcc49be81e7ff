"""Beyond images on one loop: a table with float targets trains end to end (its targets untouched, no batch
transform, no image logging), the task's own headline metric is what is optimized and monitored by
default, and eval.py writes a vector per sample as a row."""

from pathlib import Path

import pytest
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


def test_eval_writes_a_vector_a_sample_as_one_column():
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT))
    import eval as evaluation

    files = [Path("folder/a"), Path("folder/b")]
    writer = evaluation.PredictionWriter(Path("unused"), Path("folder"), files, [])
    scores, values = torch.tensor([[0.5, 1.0], [2.0, -1.0]]), torch.tensor([1.5, 2.5])
    writer.write({"scores": scores, "value": values}, files, [(8, 8), (8, 8)])
    assert writer.rows == [
        {"file": "a", "scores": "0.5 1", "value": 1.5},
        {"file": "b", "scores": "2 -1", "value": 2.5},
    ]


def test_predict_reads_a_csv_or_npy_of_feature_rows_as_the_table_s_data_option_says(tmp_path):
    """DigitsTable's predict= hook (prediction_files, read_for_prediction): each row of a CSV (its header skipped) or
    a .npy file predicted as the run's model predicts the same features; before, predict= read images only."""
    import numpy as np

    from conftest import run_here
    from models_for_tests import TableNet
    from trainkit.data.datasets import read_digits

    run_dir = tmp_path / "run"
    returncode, _, stderr = run_here("train.py", f"hydra.run.dir={run_dir}", "trainer.progress_bar=false", *TABLE_RUN)
    assert returncode == 0, stderr[-4000:]
    pixels, _ = read_digits()
    rows = tmp_path / "rows"
    rows.mkdir()
    header = ",".join(f"pixel{i}" for i in range(64))
    (rows / "a.csv").write_text("\n".join([header, *(",".join(f"{v:g}" for v in row) for row in pixels[:3])]) + "\n")
    np.save(rows / "b.npy", pixels[3:5])
    (rows / "notes.txt").write_text("not read")
    out = tmp_path / "out"
    returncode, stdout, stderr = run_here("eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", f"predict={rows}")
    assert returncode == 0, stderr[-4000:]
    assert "predictions for 5 samples" in stdout and "1 file(s) not read (hidden, or not .csv, .npy files)" in stdout
    lines = (out / "predictions.csv").read_text().splitlines()
    assert lines[0] == "file,row,value"
    assert [line.rsplit(",", 1)[0] for line in lines[1:]] == ["a.csv,0", "a.csv,1", "a.csv,2", "b.npy,0", "b.npy,1"]
    model = TableNet(64, 1)
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"])
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(pixels[:5]).float() / 16).squeeze(1)
    assert [float(line.rsplit(",", 1)[1]) for line in lines[1:]] == pytest.approx(expected.tolist(), abs=1e-6)

    (rows / "c.csv").write_text("1,2,3\n")
    returncode, _, stderr = run_here(
        "eval.py", f"hydra.run.dir={tmp_path / 'x'}", f"checkpoint={run_dir}", f"predict={rows}"
    )
    assert returncode == 1 and stderr.strip().splitlines() == [
        f"error: predict: cannot read '{rows / 'c.csv'}' (ValueError: row 1 has 3 values, but the data's rows have "
        f"64); fix or remove it"
    ]
    assert not (tmp_path / "x").exists()
