"""The sweeps row (docs/features.md): Optuna's search (hparams_search=, its SQLite continuation, a crashing and a NaN
trial, its direction against the metric) and joblib's parallel launcher. Dropping the row deletes this file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_sweeps import FAST, compose_config, fake_app, group_override, jobs, overrides, train

from conftest import ROOT
from helpers import cfg_for
from trainkit.config.validation import fill_task_defaults
from trainkit.errors import ConfigError
from trainkit.tuning import sweeps
from trainkit.tuning.sweep_direction import check_direction

__all__ = ["compose_config", "fake_app"]  # fixtures, used by name


@pytest.mark.slow  # trains in a subprocess
def test_joblib_runs_the_jobs_of_a_multirun_in_parallel_each_in_its_own_directory(tmp_path):
    train("-m", *FAST, "seed=1,2", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path}")
    assert [job.name for job in jobs(tmp_path)] == ["0", "1"]
    summaries = [json.loads((job / "summary.json").read_text()) for job in jobs(tmp_path)]
    assert [s["run_dir"] for s in summaries] == [str(job.resolve()) for job in jobs(tmp_path)]
    assert [overrides(job)[-1] for job in jobs(tmp_path)] == ["seed=1", "seed=2"]
    assert "Joblib" in OmegaConf.load(tmp_path / "multirun.yaml").hydra.launcher._target_


@pytest.mark.parametrize("search", sorted(p.stem for p in (ROOT / "conf" / "hparams_search").glob("*.yaml")))
def test_optuna_search_config_composes_with_a_direction_that_matches_the_metric(compose_config, search):
    cfg = compose_config(group_override("hparams_search", search))
    fill_task_defaults(cfg)  # optimized_metric null: the task's headline metric, as validate fills it in
    sweeper = cfg.hydra.sweeper
    assert "Optuna" in sweeper._target_ and cfg.hydra.mode.name == "MULTIRUN"
    assert sweeper.direction == ("maximize" if sweeps.maximize(cfg.optimized_metric) else "minimize")
    assert sweeper.sampler.seed is not None and sweeper.study_name and sweeper.storage is None
    for key, values in sweeper.params.items():  # every searched key is a real config key or group
        assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", key
        if key in cfg and OmegaConf.is_dict(cfg[key]):  # a group: every option exists
            options = values[values.index("(") + 1 : values.rindex(")")].split(",")
            assert all((ROOT / "conf" / key / f"{o.strip()}.yaml").exists() for o in options), values


@pytest.mark.slow  # two sweeps: ~12 s on 2 idle cores
def test_optuna_search_runs_trials_and_continues_a_sqlite_study(tmp_path):
    storage = f"hydra.sweeper.storage='sqlite:///{tmp_path}/optuna.db'"  # a plain URL: see the sqlalchemy pin
    search = [group_override("hparams_search", "digits_optuna"), *FAST, storage]
    first, second = tmp_path / "first", tmp_path / "second"
    train(*search, "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={first}")
    # The same study_name again: the study continues (a new sampler seed: new start-up trials).
    process = train(*search, "hydra.sweeper.n_trials=1", "hydra.sweeper.sampler.seed=7", f"hydra.sweep.dir={second}")
    assert "Using an existing study" in process.stderr + process.stdout
    values = []
    for sweep_dir, trials in ((first, 2), (second, 1)):
        assert [job.name for job in jobs(sweep_dir)] == [str(i) for i in range(trials)]
        for job in jobs(sweep_dir):
            summary = json.loads((job / "summary.json").read_text())
            values.append(summary["optimized_value"])
            searched = {o.split("=")[0] for o in overrides(job)}
            assert {
                "optimizer.lr",
                "optimizer.weight_decay",
                "regularization.label_smoothing",
                "data.batch_size",
            } <= searched
    results = OmegaConf.load(second / "optimization_results.yaml")
    assert results.best_value == pytest.approx(max(values))  # best of all 3 trials: the study continued
    study = _load_study(tmp_path / "optuna.db", "digits_optuna")
    assert len(study.trials) == 3 and all(t.state.name == "COMPLETE" for t in study.trials)


def _load_study(path: Path, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{path}")


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


def test_a_sweep_direction_against_the_metric_stops_at_once():
    check_direction(cfg_for("val/acc"), "maximize")
    check_direction(cfg_for("val/loss"), "minimize")
    check_direction(cfg_for("val/loss"), None)  # the basic sweeper has no direction
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.direction=minimize"):
        check_direction(cfg_for("val/loss"), "maximize")
