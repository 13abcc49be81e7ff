"""Sweeps with Hydra's basic sweeper and launcher: one run directory per job. Failed trials that do not end the sweep
and a search over a setting the run does not read: test_trial_failures.py; Optuna's search and joblib's launcher:
test_optuna_and_joblib.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import ROOT, end_all, finish
from helpers import needs_folds, template_has

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
    # One thread each: two processes with a thread per core take several times as long on a machine of few cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    try:
        for process in processes:
            ended = finish(process)
            assert ended.returncode == 0, ended.stderr[-4000:]
    finally:
        end_all(processes)  # the other multirun too, when the first failed
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
