"""The trial_failures row (docs/features.md): in a multirun, a trial that crashes or returns NaN costs that trial
(sweep.catch_failures, sweep.failed_trial_value, the traceback in the job's log file), and a search over a key the
run does not read stops at once. Dropping the row deletes this file."""

import logging
import math
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf
from test_sweeps import compose_config, jobs

from helpers import assert_one_config_error, cfg_for, template_has
from trainkit.checkpointing import signals
from trainkit.errors import ConfigError, RunFailed
from trainkit.tuning import trial_failures

__all__ = ["compose_config"]  # a fixture, used by name
# An Optuna search is the sweeps row's: its case skips once a trim took that row away.
needs_optuna = pytest.mark.skipif(
    not template_has("hparams_search/digits_optuna.yaml"), reason="this clone has no Optuna sweeper (trimmed)"
)


FAKE_APP = """
import math, sys
import hydra
from trainkit.tuning.trial_failures import run_trial

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
    assert trial_failures.failed_trial_value(cfg_for("val/acc")) == -math.inf
    assert trial_failures.failed_trial_value(cfg_for("test/acc")) == -math.inf
    assert trial_failures.failed_trial_value(cfg_for("val/loss")) == math.inf
    assert trial_failures.failed_trial_value(cfg_for("val/loss", failed_trial_value=100)) == 100.0
    no_sweep_keys = OmegaConf.create({"optimized_metric": "val/acc"})
    assert trial_failures.failed_trial_value(no_sweep_keys) == -math.inf
    # Bad values ("low", true, nan) are config errors found before the sweep: the checks' test below.


def test_run_trial_returns_the_failed_value_in_a_multirun_and_raises_otherwise():
    assert trial_failures.run_trial(lambda cfg: 0.9, cfg_for(), multirun=True) == 0.9
    assert trial_failures.run_trial(crash, cfg_for("val/loss"), multirun=True) == math.inf
    assert trial_failures.run_trial(crash, cfg_for(failed_trial_value=-1.0), multirun=True) == -1.0
    assert trial_failures.run_trial(lambda cfg: math.nan, cfg_for(), multirun=True) == -math.inf
    assert trial_failures.run_trial(lambda cfg: None, cfg_for(), multirun=True) == -math.inf
    with pytest.raises(RuntimeError, match="boom"):
        trial_failures.run_trial(crash, cfg_for(), multirun=False)  # a single run raises as usual
    assert trial_failures.run_trial(lambda cfg: None, cfg_for(), multirun=False) is None
    with pytest.raises(RuntimeError, match="boom"):
        trial_failures.run_trial(crash, cfg_for(catch_failures=False), multirun=True)


def test_run_trial_never_swallows_config_errors_or_ctrl_c():
    def bad_config(cfg):
        raise ConfigError("optimizer.lr", "must be > 0, got -1")

    def interrupted(cfg):
        raise KeyboardInterrupt

    with pytest.raises(ConfigError):
        trial_failures.run_trial(bad_config, cfg_for(), multirun=True)
    with pytest.raises(KeyboardInterrupt):
        trial_failures.run_trial(interrupted, cfg_for(), multirun=True)


def test_failed_trial_logs_one_line_and_puts_the_traceback_in_the_log_file(tmp_path):
    root = logging.getLogger()
    console_records = []
    console = logging.Handler()
    console.emit = lambda record: console_records.append(record)
    log_file = logging.FileHandler(tmp_path / "train.log")
    root.addHandler(console)
    root.addHandler(log_file)
    try:
        assert trial_failures.run_trial(crash, cfg_for(), multirun=True) == -math.inf
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
    trial_failures.check_search_space(classification, ["optimizer.lr", "regularization.label_smoothing"])
    regression = compose_config("~task", "+task._target_=tasks_for_tests.Regression")
    trial_failures.check_search_space(regression, ["optimizer.lr"])
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.params: searches regularization\.label_smoothing, "):
        trial_failures.check_search_space(regression, ["optimizer.lr", "regularization.label_smoothing"])


def test_in_a_sweep_a_signal_stops_the_sweep_and_a_non_finite_loss_fails_one_trial():
    def preempted(cfg):
        raise signals.Stopped()

    def diverged(cfg):
        raise RunFailed("train/loss is not finite")

    with pytest.raises(SystemExit) as stop:
        trial_failures.run_trial(preempted, cfg_for(), multirun=True)
    assert stop.value.code == signals.EXIT_STOPPED
    assert trial_failures.run_trial(diverged, cfg_for(), multirun=True) == -math.inf  # the sweep goes on


def test_train_py_reaches_a_trial_through_catching_failures(monkeypatch):
    """train.py's marked line: the trial it wraps fails alone in a multirun and raises in a single run."""
    monkeypatch.setattr(trial_failures, "in_multirun", lambda: True)
    assert trial_failures.catching_failures(crash)(cfg_for("val/loss")) == math.inf
    monkeypatch.setattr(trial_failures, "in_multirun", lambda: False)
    with pytest.raises(RuntimeError, match="boom"):
        trial_failures.catching_failures(crash)(cfg_for())


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("sweep.catch_failures=maybe", "sweep.catch_failures"),
        ("sweep.failed_trial_value=nan", "sweep.failed_trial_value"),
        ("sweep.failed_trial_value=worst", "sweep.failed_trial_value"),
    ],
)
def test_the_failed_trial_keys_are_checked_beside_their_code(override, key):
    assert_one_config_error([override], key)
    assert OmegaConf.load("conf/config.yaml").sweep._checks_.catch_failures == trial_failures.__name__


@needs_optuna
@pytest.mark.slow  # trains in a subprocess
def test_optuna_sweep_outlives_a_crashing_and_a_nan_trial(fake_app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    process = subprocess.run(
        [
            sys.executable,
            str(fake_app),
            "-m",
            "hydra/sweeper=optuna",
            "hydra/sweeper/sampler=grid",
            "hydra.sweeper.direction=maximize",
            "hydra.sweeper.n_jobs=1",
            "hydra.sweeper.n_trials=4",
            "+optimized_metric=val/acc",
            "+x=choice(1,2,3,4)",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = process.stdout + process.stderr
    assert process.returncode == 0, output[-4000:]
    assert OmegaConf.load(sweep_dir / "optimization_results.yaml").best_value == 4.0
    assert "trial failed: RuntimeError: CUDA out of memory (pretend) -> -inf" in output
    assert "Traceback" not in output  # one line on the console ...
    logs = {job.name: (job / "app.log").read_text() for job in jobs(sweep_dir)}
    crashed = next(text for text in logs.values() if "CUDA out of memory" in text)
    assert (
        "Traceback (most recent call last)" in crashed and "raise RuntimeError" in crashed
    )  # ... all of it in the log
    assert any("trial returned nan" in text for text in logs.values())
