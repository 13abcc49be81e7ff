"""logger=csv: metrics.csv, a row for each metrics.jsonl line; a resume trims it as it trims metrics.jsonl."""

import csv
import json

import pytest
from omegaconf import OmegaConf

from helpers import assert_one_config_error
from trainkit.tracking.loggers import build_loggers
from trainkit.tracking.loggers.csv_logger import CsvLogger


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def read_csv(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_csv_columns_grow_as_new_metrics_appear(tmp_path):
    logger = CsvLogger(tmp_path / "metrics.csv")
    logger.log({"epoch": 0, "train/loss": 1.5})
    assert read_csv(tmp_path / "metrics.csv")[0] == ["epoch", "train/loss"]
    logger.log({"epoch": 1, "val/acc": 0.75, "train/loss": 1.0})
    logger.finish()
    columns, rows = read_csv(tmp_path / "metrics.csv")
    assert columns == ["epoch", "train/loss", "val/acc"]
    assert rows == [
        {"epoch": "0", "train/loss": "1.5", "val/acc": ""},
        {"epoch": "1", "train/loss": "1.0", "val/acc": "0.75"},
    ]


def test_csv_logger_config_writes_jsonl_and_csv(tmp_path):
    loggers = build_loggers(OmegaConf.create({"name": "csv", "filename": "table.csv"}), tmp_path)
    loggers.log({"epoch": 0, "val/acc": 0.5})
    loggers.finish()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"epoch": 0, "val/acc": 0.5}]
    assert read_csv(tmp_path / "table.csv")[1] == [{"epoch": "0", "val/acc": "0.5"}]


def test_logger_filename_is_checked_beside_its_code():
    assert_one_config_error(["logger=csv", "logger.filename=3"], "logger.filename")


@pytest.mark.slow  # trains in this process (run_train)
def test_csv_logger_with_adamw_and_augmentation(run_train):
    run = run_train(
        "logger=csv",
        "optimizer=adamw",
        "scheduler=cosine",
        "augmentation=shift",
        "trainer.max_epochs=2",
        "trainer.progress_bar=false",
    )
    assert run.summary["test"]["test/acc"] >= 0.4  # chance is 0.1
    rows = (run.run_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert {"epoch", "train/loss", "val/acc", "test/acc"} <= set(header)
    assert len(rows) == 1 + len(run.metrics)  # the CSV has a row for every line of metrics.jsonl
    last_row = dict(zip(header, rows[-1].split(",")))
    assert float(last_row["test/acc"]) == pytest.approx(run.summary["test"]["test/acc"])


@pytest.mark.slow  # trains in this process (run_train)
def test_a_resume_appends_to_the_csv_as_to_metrics_jsonl(run_train):
    # 4 updates an epoch: max_steps=6 stops inside epoch 1, after its validation and test lines; the
    # resume drops those (written after the checkpoint) from both files and appends the rest.
    tiny = ("trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "trainer.log_every_n_steps=2")
    stopped = run_train(
        *tiny, "logger=csv", "trainer.max_epochs=3", "trainer.max_steps=6", "trainer.progress_bar=false"
    )
    resumed = run_train(f"resume={stopped.run_dir}", "trainer.max_steps=null", run_dir=stopped.run_dir)
    with open(resumed.run_dir / "metrics.csv", newline="") as file:
        rows = [{key: value for key, value in row.items() if value != ""} for row in csv.DictReader(file)]
    lines = resumed.metrics
    assert [m["epoch"] for m in resumed.epoch_metrics()] == [0, 1, 2]
    assert [(int(row["epoch"]), int(row["step"]), set(row)) for row in rows] == [
        (m["epoch"], m["step"], set(m)) for m in lines
    ]
