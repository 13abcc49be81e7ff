"""metrics.jsonl (always) and the tracker chosen by `logger`."""

import csv
import json
import math

from omegaconf import OmegaConf

from trainkit.tracking.loggers import CsvLogger, JsonlLogger, build_loggers


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def read_csv(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_jsonl_writes_one_object_per_line(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"epoch": 0, "step": 10, "train/loss": 2.3, "lr": 0.1})
    logger.log({"epoch": 1, "step": 20, "val/acc": 0.5})
    logger.finish()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {"epoch": 0, "step": 10, "train/loss": 2.3, "lr": 0.1},
        {"epoch": 1, "step": 20, "val/acc": 0.5},
    ]


def test_jsonl_is_readable_before_finish(tmp_path):
    # A crashed run keeps its history: every line is flushed as it is logged.
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"step": 1, "train/loss": 1.0})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "train/loss": 1.0}]
    logger.finish()


def test_jsonl_writes_nan_and_inf_as_null(tmp_path):
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"step": 1, "train/loss": math.nan, "grad_norm": math.inf, "other": -math.inf, "lr": 0.1})
    logger.finish()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"step": 1, "train/loss": None, "grad_norm": None, "other": None, "lr": 0.1}


def test_jsonl_appends_to_an_existing_file(tmp_path):
    # A resumed run continues the same record.
    for step in (1, 2):
        logger = JsonlLogger(tmp_path / "metrics.jsonl")
        logger.log({"step": step})
        logger.finish()
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 2}]


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


def test_none_logger_config_writes_only_jsonl(tmp_path):
    loggers = build_loggers(OmegaConf.create({"name": "none"}), tmp_path)
    loggers.log({"epoch": 0})
    loggers.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_local_loggers_ignore_images_and_summaries_and_have_no_run_id(tmp_path):
    # train.py makes every call on every logger; a logger with no use for one ignores it.
    loggers = build_loggers(OmegaConf.create({"name": "csv"}), tmp_path)
    assert loggers.run_ids == {}
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.log_image("train/samples", tmp_path / "missing.png", step=0)
    loggers.summary({"best/val/acc": 0.5})
    loggers.finish(failed=True)
    loggers.finish(failed=True)  # again, from a `finally`: harmless
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"epoch": 0, "step": 1, "val/acc": 0.5}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "metrics.jsonl"]


# An unknown logger.name or logger.mode is the schema's to report: tests/unit/config/test_config.py.
