"""The sweeps row (docs/features.md): Optuna's search (hparams_search=, its SQLite continuation, its direction against
the metric) and joblib's parallel launcher. Dropping the row deletes this file."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_sweeps import FAST, compose_config, group_override, jobs, overrides, train

from conftest import ROOT
from helpers import cfg_for
from trainkit.config.validation import fill_task_defaults
from trainkit.errors import ConfigError
from trainkit.tasks.task import higher_is_better
from trainkit.tuning import sweep_direction
from trainkit.tuning.sweep_direction import check_direction

__all__ = ["compose_config"]  # a fixture, used by name


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
    assert sweeper.direction == ("maximize" if higher_is_better(None, cfg.optimized_metric) else "minimize")
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


def test_a_sweep_direction_against_the_metric_stops_at_once():
    check_direction(cfg_for("val/acc"), "maximize")
    check_direction(cfg_for("val/loss"), "minimize")
    check_direction(cfg_for("val/loss"), None)  # the basic sweeper has no direction
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.direction=minimize"):
        check_direction(cfg_for("val/loss"), "maximize")


def test_train_py_checks_the_direction_before_a_trial_of_a_multirun_only(monkeypatch):
    """train.py's marked line: a trial of a multirun whose sweeper maximizes a loss is refused before it trains."""
    trained = []
    monkeypatch.setattr(sweep_direction, "sweeper_direction", lambda: "maximize")
    monkeypatch.setattr(sweep_direction, "in_multirun", lambda: True)
    with pytest.raises(ConfigError, match=r"^hydra\.sweeper\.direction: is maximize but optimized_metric=val/loss"):
        sweep_direction.checking_direction(trained.append)(cfg_for("val/loss"))
    assert trained == []
    monkeypatch.setattr(sweep_direction, "in_multirun", lambda: False)
    sweep_direction.checking_direction(trained.append)(cfg_for("val/loss"))
    assert len(trained) == 1
