"""Sweeps with Hydra's basic sweeper and launcher: one run directory per job, failed trials that do not end the sweep,
a search over a setting the run does not read. Optuna's search and joblib's launcher: test_optuna_and_joblib.py."""

import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import ROOT
from helpers import cfg_for, needs_folds, template_has
from trainkit.errors import ConfigError
from trainkit.tuning import sweeps

FAST = ("debug=fast", "trainer.max_epochs=1")
# hydra/launcher=joblib is the sweeps row's (docs/features.md): the basic launcher where a trim took it away.
PARALLEL = (
    ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2") if template_has("hparams_search/digits_optuna.yaml") else ()
)


def group_override(group: str, option: str) -> str:
    """`group=option` once conf/config.yaml lists the group in its defaults, else `+group=option`."""
    defaults = OmegaConf.load(ROOT / "conf" / "config.yaml").defaults
    listed = any(OmegaConf.is_dict(d) and group in d for d in defaults)
    return f"{group}={option}" if listed else f"+{group}={option}"


def train(*args: str, cwd=ROOT, timeout=240) -> subprocess.CompletedProcess:
    process = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert process.returncode == 0, f"train.py {' '.join(args)} failed:\n{process.stderr[-4000:]}"
    return process


def jobs(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def overrides(job: Path) -> list[str]:
    return list(OmegaConf.load(job / ".hydra" / "overrides.yaml"))


@pytest.fixture
def compose_config():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str((ROOT / "conf").resolve()), version_base=None):
        yield lambda *overrides: compose("config", overrides=list(overrides), return_hydra_config=True)
    GlobalHydra.instance().clear()


# --- basic and parallel multiruns ---------------------------------------------------------------


@pytest.mark.slow  # trains in a subprocess
def test_multiruns_started_together_get_their_own_directories(tmp_path):
    # Two multiruns at once, with the default outputs/multiruns/<time with microseconds> below a
    # temporary cwd, with the basic (sequential) launcher (joblib's parallel one: test_optuna_and_joblib.py).
    base = [sys.executable, str(ROOT / "train.py"), "-m", *FAST, "seed=1,2"]
    commands = [base, base]
    processes = [
        subprocess.Popen(c, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-4000:]
    sweep_dirs = sorted((tmp_path / "outputs" / "multiruns").iterdir())
    assert len(sweep_dirs) == 2, sweep_dirs
    for sweep_dir in sweep_dirs:
        assert len(sweep_dir.name.rsplit("-", 1)[-1]) == 6, f"{sweep_dir.name}: no microseconds"
        assert [job.name for job in jobs(sweep_dir)] == ["0", "1"]
        summaries = [json.loads((job / "summary.json").read_text()) for job in jobs(sweep_dir)]
        assert [s["run_dir"] for s in summaries] == [str(job.resolve()) for job in jobs(sweep_dir)]
        assert [s["epochs"] for s in summaries] == [1, 1]
        assert [overrides(job)[-1] for job in jobs(sweep_dir)] == ["seed=1", "seed=2"]


@needs_folds
@pytest.mark.slow  # trains three jobs in a subprocess
def test_k_fold_cross_validation_is_a_sweep_over_the_folds_in_parallel_too(tmp_path):
    """-m data.folds=3 'data.fold=range(3)' with the joblib launcher (the basic one where the sweeps row is trimmed): a
    job a fold, each validating on its own third of the training pool (the checkpoint's data fingerprint), every one
    testing on the same test split."""
    import torch

    folds = ("data.folds=3", "data.fold=range(3)", *PARALLEL)
    train("-m", *FAST, *folds, f"hydra.sweep.dir={tmp_path}")
    assert [overrides(job)[-2:] for job in jobs(tmp_path)] == [["data.folds=3", f"data.fold={i}"] for i in range(3)]
    seen = [torch.load(job / "checkpoints" / "last.pt", weights_only=True)["data"] for job in jobs(tmp_path)]
    assert [data["fold"] for data in seen] == [f"fold {i} of 3" for i in range(3)]
    assert sum(data["val"]["shape"][0] for data in seen) == 1797 - 359  # the folds cover the pool: train and val
    assert all(data["train"]["shape"][0] + data["val"]["shape"][0] == 1438 for data in seen)
    assert {data["test"]["checksum"] for data in seen} == {seen[0]["test"]["checksum"]}  # the test split, untouched
    assert len({data["val"]["checksum"] for data in seen}) == 3
    assert all("test/acc" in json.loads((job / "summary.json").read_text())["test"] for job in jobs(tmp_path))


# --- failed trials ------------------------------------------------------------------------------

FAKE_APP = """
import math, sys
import hydra
from trainkit.tuning.sweeps import run_trial

def objective(cfg):
    if cfg.x == 2:
        raise RuntimeError("CUDA out of memory (pretend)")
    if cfg.x == 3:
        return math.nan  # a diverged run
    return float(cfg.x)

@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    return run_trial(objective, cfg)

main()
"""


@pytest.fixture
def fake_app(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(FAKE_APP))
    return script


@pytest.mark.slow  # trains in a subprocess
def test_basic_sweep_with_catch_failures_off_reports_the_failure(fake_app, tmp_path):
    process = subprocess.run(
        [
            sys.executable,
            str(fake_app),
            "-m",
            "+x=1,2",
            "+optimized_metric=val/acc",
            "+sweep.catch_failures=false",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode != 0 and "CUDA out of memory (pretend)" in process.stderr


def crash(cfg):
    raise RuntimeError("boom")


def test_failed_trial_value_is_the_worst_value_of_the_metric_unless_set():
    assert sweeps.failed_trial_value(cfg_for("val/acc")) == -math.inf
    assert sweeps.failed_trial_value(cfg_for("test/acc")) == -math.inf
    assert sweeps.failed_trial_value(cfg_for("val/loss")) == math.inf
    assert sweeps.failed_trial_value(cfg_for("val/loss", failed_trial_value=100)) == 100.0
    assert sweeps.failed_trial_value(OmegaConf.create({"optimized_metric": "val/acc"})) == -math.inf  # no sweep keys
    # Bad values ("low", true, nan) are config errors found before the sweep: tests/unit/config/test_config.py.


def test_run_trial_returns_the_failed_value_in_a_multirun_and_raises_otherwise():
    assert sweeps.run_trial(lambda cfg: 0.9, cfg_for(), multirun=True) == 0.9
    assert sweeps.run_trial(crash, cfg_for("val/loss"), multirun=True) == math.inf
    assert sweeps.run_trial(crash, cfg_for(failed_trial_value=-1.0), multirun=True) == -1.0
    assert sweeps.run_trial(lambda cfg: math.nan, cfg_for(), multirun=True) == -math.inf
    assert sweeps.run_trial(lambda cfg: None, cfg_for(), multirun=True) == -math.inf
    with pytest.raises(RuntimeError, match="boom"):
        sweeps.run_trial(crash, cfg_for(), multirun=False)  # a single run raises as usual
    assert sweeps.run_trial(lambda cfg: None, cfg_for(), multirun=False) is None
    with pytest.raises(RuntimeError, match="boom"):
        sweeps.run_trial(crash, cfg_for(catch_failures=False), multirun=True)


def test_run_trial_never_swallows_config_errors_or_ctrl_c():
    def bad_config(cfg):
        raise ConfigError("optimizer.lr", "must be > 0, got -1")

    def interrupted(cfg):
        raise KeyboardInterrupt

    with pytest.raises(ConfigError):
        sweeps.run_trial(bad_config, cfg_for(), multirun=True)
    with pytest.raises(KeyboardInterrupt):
        sweeps.run_trial(interrupted, cfg_for(), multirun=True)


def test_failed_trial_logs_one_line_and_puts_the_traceback_in_the_log_file(tmp_path):
    root = logging.getLogger()
    console_records = []
    console = logging.Handler()
    console.emit = lambda record: console_records.append(record)
    log_file = logging.FileHandler(tmp_path / "train.log")
    root.addHandler(console)
    root.addHandler(log_file)
    try:
        assert sweeps.run_trial(crash, cfg_for(), multirun=True) == -math.inf
    finally:
        root.removeHandler(console)
        root.removeHandler(log_file)
        log_file.close()
    assert [r.getMessage() for r in console_records if r.name == "sweep"] == [
        f"trial failed: RuntimeError: boom -> -inf goes to the sweeper (sweep.catch_failures=true); "
        f"traceback in {tmp_path / 'train.log'}"
    ]
    assert all(r.exc_info is None for r in console_records)
    text = (tmp_path / "train.log").read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom" in text


def test_a_search_over_a_setting_the_run_does_not_read_stops_at_once(compose_config):
    classification = compose_config()
    sweeps.check_search_space(classification, ["optimizer.lr", "regularization.label_smoothing"])
    regression = compose_config("~task", "+task._target_=tasks_for_tests.Regression")
    sweeps.check_search_space(regression, ["optimizer.lr"])
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.params: searches regularization\.label_smoothing, "):
        sweeps.check_search_space(regression, ["optimizer.lr", "regularization.label_smoothing"])
