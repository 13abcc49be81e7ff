"""logger=wandb with the real wandb in offline mode (no account, no network), read back from the run's `.wandb`
file (wandb_offline.OfflineRun, as `wandb sync` would); scripts/wandb_sweep.yaml."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from PIL import Image

from conftest import ROOT, composed
from helpers import assert_one_config_error
from trainkit.tasks.task import higher_is_better
from trainkit.tracking.loggers import build_loggers
from wandb_offline import OfflineRun, local_wandb, offline_run

wandb = pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def quiet_local_wandb(tmp_path, monkeypatch):
    local_wandb(monkeypatch, tmp_path / "wandb-home")


@pytest.fixture
def run_dir(tmp_path):
    """A run directory that exists before the loggers start, as Hydra makes it."""
    path = tmp_path / "run"
    path.mkdir()
    return path


def wandb_cfg(**overrides):
    cfg = {
        "name": "wandb",
        "mode": "offline",
        "project": "trainkit",
        "entity": None,
        "group": None,
        "run_name": None,
        "tags": [],
        "notes": None,
        "log_images": True,
        "init_timeout": 90,
    }
    return OmegaConf.create({**cfg, **overrides})


def test_offline_run_lands_in_the_run_directory_with_config_history_and_summary(run_dir):
    config = {"optimizer": {"lr": 0.1, "name": "sgd"}, "seed": 3}
    loggers = build_loggers(
        wandb_cfg(tags=["smoke"]), run_dir, config=config, run_name="optimizer.lr=0.1", group="sweep-1"
    )
    assert loggers.run_ids.get("wandb") is not None
    loggers.log({"epoch": 0, "step": 10, "train/step_loss": 2.0, "lr": 0.1})
    loggers.log({"epoch": 0, "step": 10, "train/loss": 1.9, "val/loss": 1.5, "val/acc": 0.4})  # same step
    loggers.log({"epoch": 1, "step": 20, "train/loss": 1.0, "val/loss": 0.9, "val/acc": 0.7})
    loggers.log({"epoch": 1, "step": 20, "test/loss": 0.8, "test/acc": 0.75})
    loggers.summary({"best/val/acc": 0.7, "best/epoch": 1})
    loggers.finish()

    run = offline_run(run_dir)
    assert run.directory.name.endswith(loggers.run_ids.get("wandb")) and run.run_id == loggers.run_ids.get("wandb")
    assert run.config["optimizer"] == {"lr": 0.1, "name": "sgd"} and run.config["seed"] == 3
    assert (run.display_name, run.group, run.tags) == ("optimizer.lr=0.1", "sweep-1", ["smoke"])
    # Nothing dropped: each dict is a row, plotted against our `step`.
    assert [row["step"] for row in run.history] == [10, 10, 20, 20]
    assert [row["val/acc"] for row in run.rows_with("val/acc")] == [0.4, 0.7]
    assert run.rows_with("test/acc")[0]["test/acc"] == 0.75
    assert run.summary["val/acc"] == 0.7 and run.summary["test/acc"] == 0.75 and run.summary["step"] == 20
    assert run.summary["best/val/acc"] == 0.7 and run.summary["best/epoch"] == 1
    assert run.exit_code == 0
    # metrics.jsonl is written as always.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["test/acc"] == 0.75


def test_an_offline_run_says_where_it_is_and_how_to_upload_it(run_dir, caplog):
    loggers = build_loggers(wandb_cfg(), run_dir)
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    with caplog.at_level(logging.INFO, logger="trainkit.tracking.loggers"):
        loggers.finish()
    run = offline_run(run_dir)
    lines = [r.getMessage() for r in caplog.records if "wandb sync" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].endswith(f"wandb sync {run.directory}") and f"offline run in {run.directory};" in lines[0]
    assert run.directory.parent == run_dir / "wandb" and run.directory.name.startswith("offline-run-")


def test_a_resumed_offline_run_says_to_sync_every_part(run_dir, caplog):
    # A resume in the same run directory writes a second offline-run folder under the same run id.
    first = build_loggers(wandb_cfg(), run_dir)
    first.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    first.finish()
    time.sleep(1)  # the folder's name has the start time to the second
    second = build_loggers(wandb_cfg(), run_dir, resume_ids={"wandb": first.run_ids.get("wandb")})
    second.log({"epoch": 1, "step": 2, "val/acc": 0.6})
    with caplog.at_level(logging.INFO, logger="trainkit.tracking.loggers"):
        second.finish()
    parts = sorted((run_dir / "wandb").glob(f"offline-run-*-{first.run_ids.get('wandb')}"))
    lines = [r.getMessage() for r in caplog.records if "wandb sync" in r.getMessage()]
    assert len(parts) == 2 and lines[0].endswith(f"wandb sync {parts[0]} {parts[1]}"), lines


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    """metrics.jsonl as a resume leaves it: trimmed to the checkpoint's step."""
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_resume_after_a_kill_logs_what_the_killed_part_never_wrote_and_syncs_only_parts_with_records(run_dir, caplog):
    # W&B's service writes a part's .wandb file on its own schedule: a SIGKILL leaves its header alone.
    rows = [{"epoch": 0, "step": 1, "train/step_loss": 2.0}, {"epoch": 0, "step": 2, "val/acc": 0.5, "val/loss": None}]
    first = build_loggers(wandb_cfg(), run_dir)
    run_id = first.run_ids.get("wandb")
    for row in rows:
        first.log(row)
    first.finish()
    killed = offline_run(run_dir).directory
    (killed / f"run-{run_id}.wandb").write_bytes((killed / f"run-{run_id}.wandb").read_bytes()[:7])
    write_metrics(run_dir, rows)
    time.sleep(1)  # the folder's name has the start time to the second
    second = build_loggers(wandb_cfg(), run_dir, resume_ids={"wandb": run_id}, resume_step=2)
    second.log({"epoch": 1, "step": 3, "train/step_loss": 1.0})
    with caplog.at_level(logging.INFO, logger="trainkit.tracking.loggers"):
        second.finish()
    resumed = [part for part in sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}")) if part != killed]
    run = OfflineRun(resumed[0])
    deadline = time.monotonic() + 20
    while run.exit_code is None and time.monotonic() < deadline:
        time.sleep(0.05)
        run = OfflineRun(resumed[0])
    assert [(row["step"], sorted(k for k in row if not k.startswith("_"))) for row in run.history] == [
        (1, ["epoch", "step", "train/step_loss"]),
        (2, ["epoch", "step", "val/acc"]),  # val/loss was not finite: null in metrics.jsonl
        (3, ["epoch", "step", "train/step_loss"]),
    ]
    [line] = [r.getMessage() for r in caplog.records if "wandb sync" in r.getMessage()]
    assert line.endswith(f"wandb sync {resumed[0]}"), line  # the killed part holds nothing to sync


def test_a_resume_leaves_out_what_an_earlier_part_holds_after_the_checkpoint(run_dir):
    first = build_loggers(wandb_cfg(), run_dir)
    run_id = first.run_ids.get("wandb")
    for step in (1, 2, 3):  # the checkpoint stood at step 1
        first.log({"epoch": 0, "step": step, "train/step_loss": float(step), "lr": 0.1})
    first.log({"epoch": 0, "step": 3, "lr": 0.1, "val/acc": 0.5})  # an epoch's end: lr again at its last step
    first.finish()
    offline_run(run_dir)  # the first part's file is written
    write_metrics(run_dir, [{"epoch": 0, "step": 1, "train/step_loss": 1.0, "lr": 0.1}])
    time.sleep(1)
    second = build_loggers(wandb_cfg(), run_dir, resume_ids={"wandb": run_id}, resume_step=1)
    for step in (2, 3, 4):
        second.log({"epoch": 0, "step": step, "train/step_loss": float(step), "lr": 0.1})
    second.log({"epoch": 0, "step": 4, "lr": 0.1, "val/acc": 0.6})
    second.finish()
    parts = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    deadline = time.monotonic() + 20
    while (runs := [OfflineRun(part) for part in parts])[-1].exit_code is None and time.monotonic() < deadline:
        time.sleep(0.05)
    held = [
        (row["step"], key) for run in runs for row in run.history for key in row if key in ("lr", "train/step_loss")
    ]
    assert sorted(held) == sorted({(step, key) for step in (1, 2, 3, 4) for key in ("lr", "train/step_loss")})
    assert [row["step"] for run in runs for row in run.rows_with("val/acc")] == [3, 4]


def test_a_failed_run_finishes_with_a_nonzero_exit_code_once(run_dir):
    loggers = build_loggers(wandb_cfg(), run_dir)
    loggers.log({"epoch": 0, "step": 1, "train/step_loss": float("nan")})
    loggers.finish(failed=True)
    loggers.finish(failed=True)  # a second call (e.g. from a `finally`) does nothing
    run = offline_run(run_dir)
    assert run.exit_code == 1
    assert run.history[0]["step"] == 1


def test_resume_id_continues_the_same_run_id(tmp_path):
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = build_loggers(wandb_cfg(), tmp_path / "first", run_name="first")
    run_id = first.run_ids.get("wandb")
    first.log({"epoch": 0, "step": 10, "val/acc": 0.5})
    first.finish()

    second = build_loggers(wandb_cfg(), tmp_path / "second", run_name="resume=last.pt", resume_ids={"wandb": run_id})
    assert second.run_ids.get("wandb") == run_id
    second.log({"epoch": 1, "step": 20, "val/acc": 0.6})
    second.finish()
    run = offline_run(tmp_path / "second")
    assert run.directory.name.endswith(f"-{run_id}") and run.run_id == run_id
    assert run.display_name == ""  # a resumed run keeps its name: the derived one is not sent
    assert run.rows_with("val/acc")[0]["step"] == 20


def test_init_failure_warns_once_and_training_goes_on_locally(run_dir, monkeypatch, caplog):
    def broken_init(**kwargs):
        raise wandb.errors.CommError("Timed out while retrying: no such host\nConsider increasing init_timeout")

    monkeypatch.setattr(wandb, "init", broken_init)
    with caplog.at_level(logging.WARNING, logger="trainkit.tracking.loggers"):
        loggers = build_loggers(wandb_cfg(mode="online"), run_dir)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "local logging only" in warnings[0].getMessage() and "CommError" in warnings[0].getMessage()
    assert loggers.run_ids.get("wandb") is None
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.log_image("train/samples", np.zeros((4, 4, 3), np.uint8), step=0)
    loggers.summary({"best/val/acc": 0.5})
    loggers.finish(failed=True)
    assert [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        {"epoch": 0, "step": 1, "val/acc": 0.5}
    ]
    assert not (run_dir / "wandb").exists()


class FakeRun:
    id = "fake123"

    def __init__(self, fail_on_log=False):
        self.fail_on_log, self.logged, self.finished, self.summary = fail_on_log, [], [], {}

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, metrics):
        if self.fail_on_log:
            raise RuntimeError("wandb-core went away")
        self.logged.append(metrics)

    def finish(self, exit_code=0):
        self.finished.append(exit_code)


def test_init_gets_the_explicit_mode_dir_names_and_resume(run_dir, monkeypatch):
    calls, run = [], FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or run)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the config's mode wins over the environment
    cfg = wandb_cfg(mode="online", entity="team", tags=OmegaConf.create(["a", "b"]), notes="why")
    loggers = build_loggers(cfg, run_dir, config={"seed": 0}, run_name="seed=1", group="sweep")
    kwargs = calls[0]
    assert kwargs["mode"] == "online" and kwargs["dir"] == str(run_dir)
    assert (kwargs["project"], kwargs["entity"], kwargs["tags"], kwargs["notes"]) == (
        "trainkit",
        "team",
        ["a", "b"],
        "why",
    )
    assert (kwargs["name"], kwargs["group"], kwargs["config"]) == ("seed=1", "sweep", {"seed": 0})
    assert kwargs["id"] is None and kwargs["resume"] is None
    assert loggers.run_ids.get("wandb") == "fake123"
    loggers.finish(failed=True)
    assert run.finished == [1]

    build_loggers(
        wandb_cfg(run_name="mine", group="g"), run_dir, run_name="seed=1", group="sweep", resume_ids={"wandb": "abc"}
    )
    assert (calls[1]["name"], calls[1]["group"], calls[1]["id"], calls[1]["resume"]) == ("mine", "g", "abc", "allow")


def test_a_logging_failure_warns_finishes_the_run_and_stops_wandb(run_dir, monkeypatch, caplog):
    run = FakeRun(fail_on_log=True)
    monkeypatch.setattr(wandb, "init", lambda **kwargs: run)
    loggers = build_loggers(wandb_cfg(), run_dir)
    with caplog.at_level(logging.WARNING, logger="trainkit.tracking.loggers"):
        loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
        loggers.log({"epoch": 1, "step": 2, "val/acc": 0.6})
    assert len(caplog.records) == 1 and "local logging only" in caplog.records[0].getMessage()
    assert run.finished == [1]
    loggers.finish()
    assert run.finished == [1]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2


def test_disabled_mode_writes_no_wandb_files(run_dir, caplog):
    loggers = build_loggers(wandb_cfg(mode="disabled"), run_dir, config={"seed": 0})
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.log_image("train/samples", np.zeros((4, 4, 3), np.uint8), step=0)
    loggers.summary({"best/val/acc": 0.5})
    assert loggers.run_ids.get("wandb") is None
    with caplog.at_level(logging.INFO, logger="trainkit.tracking.loggers"):
        loggers.finish()
    assert not any("wandb sync" in r.getMessage() for r in caplog.records)  # nothing to upload
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


def test_wandb_config_defaults_to_offline(monkeypatch):
    from hydra import compose, initialize_config_dir

    monkeypatch.delenv("WANDB_MODE", raising=False)
    conf = Path(__file__).resolve().parents[3] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose("config", overrides=["logger=wandb"])
    assert cfg.logger.trackers.wandb and cfg.logger.mode == "offline" and cfg.logger.log_images is True
    assert cfg.logger.log_predictions == 4  # a text sample, or masks, after each validation: on by default
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert cfg.logger.mode == "disabled"


def test_log_image_writes_the_png_into_the_offline_run(run_dir):
    loggers = build_loggers(wandb_cfg(), run_dir)
    grid = np.random.default_rng(0).integers(0, 256, (15, 29, 3), dtype=np.uint8)  # a picture as trackers take it
    loggers.log_image("train/samples", grid, step=0)
    Image.fromarray(grid).save(run_dir / "samples.png")
    loggers.log_image("train/samples_file", run_dir / "samples.png", step=0)
    loggers.finish()
    run = offline_run(run_dir)
    images = sorted((run.directory / "files" / "media" / "images").rglob("*.png"))  # train/ is a folder
    assert len(images) == 2
    row = run.rows_with("train/samples")[0]
    assert row["train/samples"]["width"] == grid.shape[1] and row["train/samples"]["height"] == grid.shape[0]


def test_log_images_false_skips_images(run_dir):
    loggers = build_loggers(wandb_cfg(log_images=False), run_dir)
    loggers.log_image("train/samples", np.zeros((4, 4, 3), np.uint8), step=0)
    loggers.finish()
    assert not (offline_run(run_dir).directory / "files" / "media").exists()


@pytest.mark.slow  # trains in a subprocess
def test_multirun_jobs_are_wandb_runs_of_one_group_named_after_their_overrides(tmp_path):
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        f"hydra.sweep.dir={sweep}",
        "logger=wandb",
        "logger.mode=offline",
        "debug=fast",
        "print_config=false",
        "seed=1,2",
    ]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    runs = [offline_run(sweep / job) for job in ("0", "1")]
    assert runs[0].group == runs[1].group == sweep.name
    names = sorted(run.display_name for run in runs)  # Hydra's override_dirname: sorted key=value pairs
    assert [name.rsplit(",", 1)[-1] for name in names] == ["seed=1", "seed=2"]
    assert all("debug=fast" in name and "logger=wandb" in name for name in names)
    for job, run in zip(("0", "1"), runs):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert run.exit_code == 0
        assert run.summary["test/acc"] == summary["test"]["test/acc"]  # the same number, not a copy of something else
        assert run.summary["best/val/acc"] == summary["best"]["val/acc"]
        assert run.summary["stop_reason"] == summary["stop_reason"]
        assert run.config["seed"] == int(run.display_name.rsplit("seed=", 1)[-1])
        epochs = [json.loads(line) for line in (sweep / job / "metrics.jsonl").read_text().splitlines()]
        assert [row["val/acc"] for row in run.rows_with("val/acc")] == [m["val/acc"] for m in epochs if "val/acc" in m]
        # The console names each job's offline run and the command that uploads it.
        assert f"wandb sync {run.directory}" in process.stdout + process.stderr


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["logger=wandb", "logger.mode=ofline"], "logger.mode"),
        (["logger=wandb", "logger.project=3"], "logger.project"),
        (["logger=wandb", "logger.init_timeout=0"], "logger.init_timeout"),
    ],
)
def test_the_wandb_keys_are_checked_beside_its_code(overrides, key):
    assert_one_config_error(overrides, key)


def test_wandb_sweep_config_drives_real_config_keys():
    spec = yaml.safe_load((ROOT / "scripts" / "wandb_sweep.yaml").read_text())
    assert (ROOT / spec["program"]).exists()
    assert spec["command"][:3] == ["${env}", "${interpreter}", "${program}"] and "${args_no_hyphens}" in spec["command"]
    assert spec["method"] in ("bayes", "random", "grid")
    metric = spec["metric"]
    assert metric["name"] in ("val/acc", "val/loss")  # what train.py logs each epoch
    assert metric["goal"] == ("maximize" if higher_is_better(None, metric["name"]) else "minimize")
    # One value of every parameter, with the fixed overrides of `command`, must compose.
    fixed = [arg for arg in spec["command"] if not arg.startswith("${")]
    sampled = []
    for key, parameter in spec["parameters"].items():
        value = parameter["values"][0] if "values" in parameter else parameter.get("value", parameter.get("min"))
        sampled.append(f"{key}={value}")
    cfg = composed(*fixed, *sampled)
    for key in spec["parameters"]:
        assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", f"{key}: not a config key"
    assert cfg.optimizer.lr == spec["parameters"]["optimizer.lr"]["min"]
