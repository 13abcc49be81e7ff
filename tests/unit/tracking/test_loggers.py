"""metrics.jsonl (always) and the trackers chosen by `logger`: their names, their config files merged, every call
fanned out to each. Each tracker's own tests are its own files (docs/features.md)."""

import json
import math

from omegaconf import OmegaConf

from conftest import ROOT, composed
from helpers import TrackerCalls
from trainkit.tracking.loggers import JsonlLogger, Loggers, build_loggers, run_names, tracker_names, trackers

LOGGER_CONF = ROOT / "conf" / "logger"


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


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


def test_none_logger_config_writes_only_jsonl(tmp_path):
    loggers = build_loggers(OmegaConf.create({"name": "none"}), tmp_path)
    loggers.log({"epoch": 0})
    loggers.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_local_loggers_ignore_images_and_summaries_and_have_no_run_id(tmp_path):
    # train.py makes every call on every logger; a logger with no use for one ignores it.
    loggers = build_loggers(OmegaConf.create({"name": "none"}), tmp_path)
    assert loggers.run_ids == {}
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.log_image("train/samples", tmp_path / "missing.png", step=0)
    loggers.summary({"best/val/acc": 0.5})
    loggers.finish(failed=True)
    loggers.finish(failed=True)  # again, from a `finally`: harmless
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"epoch": 0, "step": 1, "val/acc": 0.5}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_run_names_from_hydra_config():
    multirun = OmegaConf.create(
        {
            "mode": "MULTIRUN",
            "sweep": {"dir": "outputs/multiruns/2026-01-02_03-04-05"},
            "job": {"override_dirname": "optimizer.lr=0.1,seed=1"},
            "runtime": {"output_dir": "/x/outputs/multiruns/2026-01-02_03-04-05/3"},
        }
    )
    assert run_names(multirun) == ("optimizer.lr=0.1,seed=1", "2026-01-02_03-04-05")
    single = OmegaConf.create(
        {
            "mode": "RUN",
            "sweep": {"dir": "multirun/x"},
            "job": {"override_dirname": ""},
            "runtime": {"output_dir": "/x/outputs/runs/2026-01-02_03-04-05-123456"},
        }
    )
    assert run_names(single) == ("2026-01-02_03-04-05-123456", None)
    assert run_names({"job": {}}) == (None, None)
    assert run_names() == (None, None)  # outside a Hydra app


def test_run_names_reads_hydra_run_modes():
    from hydra.types import RunMode

    cfg = OmegaConf.create(
        {"mode": RunMode.MULTIRUN, "sweep": {"dir": "ms/abc"}, "job": {"override_dirname": "seed=2"}}
    )
    assert run_names(cfg) == ("seed=2", "abc")


def test_run_names_from_the_saved_hydra_config_in_a_worker_process(tmp_path):
    # A DDP worker that train.py spawned has no HydraConfig; Hydra's .hydra/hydra.yaml is there.
    job_dir = tmp_path / "multiruns" / "2026-01-02_03-04-05" / "1"
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  sweep:\n    dir: multiruns/${now:%Y-%m-%d_%H-%M-%S}\n  mode: MULTIRUN\n"
        f"  job:\n    override_dirname: seed=1\n  runtime:\n    output_dir: {job_dir}\n"
    )
    assert run_names(run_dir=job_dir) == ("seed=1", "2026-01-02_03-04-05")
    assert run_names(run_dir=tmp_path) == (None, None)  # no saved config


def test_a_logger_list_merges_the_trackers_and_the_keys_of_each_file():
    names = sorted(trackers(), reverse=True)  # an order of our own, not the modules' or the files'
    cfg = composed(f"logger=[{','.join(['none', *names])}]")
    assert tracker_names(cfg.logger) == names
    merged = OmegaConf.to_container(cfg.logger, resolve=False)
    for name in names:  # each file's own keys and values, e.g. logger=wandb's project, logger=mlflow's experiment
        own = OmegaConf.to_container(OmegaConf.load(LOGGER_CONF / f"{name}.yaml"), resolve=False)
        assert {key: merged[key] for key in own if key not in ("trackers", "_checks_")} == {
            key: value for key, value in own.items() if key not in ("trackers", "_checks_")
        }, name
        assert merged["_checks_"][name] == own["_checks_"][name] == f"trainkit.tracking.loggers.{name}_logger"
    assert tracker_names(composed("logger=none").logger) == []
    assert tracker_names(OmegaConf.create({"name": "csv"})) == ["csv"]  # a config from before `trackers`


def test_every_call_reaches_every_tracker(tmp_path):
    first, second = TrackerCalls(), TrackerCalls()
    second.run_id = "abc"
    loggers = Loggers([first, second], ["first", "second"])
    assert loggers.run_ids == {"second": "abc"}  # the trackers that keep a run a resume continues
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.log_image("train/samples", tmp_path / "samples.png", step=0)
    loggers.log_text("val/sample", "import os", step=1)
    loggers.summary({"best/val/acc": 0.5})
    loggers.finish(failed=True)
    assert (
        first.calls
        == second.calls
        == [
            ("log", ({"epoch": 0, "step": 1, "val/acc": 0.5},)),
            ("log_image", ("train/samples", tmp_path / "samples.png", 0)),
            ("log_text", ("val/sample", "import os", 1)),
            ("summary", ({"best/val/acc": 0.5},)),
            ("finish", (True,)),
        ]
    )
