"""logger=wandb end to end: a run killed and resumed holds every step once in its offline run files, and under
torchrun rank 0 alone writes the W&B run (read back from the `.wandb` files: wandb_offline); its config keeps the
facts of provenance.json."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT
from helpers import killed_and_resumed
from wandb_offline import OfflineRun, local_wandb, read_records

pytest.importorskip("wandb")


def test_the_wandb_run_keeps_the_facts_of_provenance(run_train, tmp_path, monkeypatch):
    """The run config holds provenance.json's facts under `provenance`."""
    local_wandb(monkeypatch, tmp_path / "wandb-home")
    monkeypatch.setenv("WANDB_MODE", "offline")
    quick = ("trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.progress_bar=false")
    run = run_train(*quick, "logger=wandb", isolated=True)  # W&B's service ends with the process that started it
    if not (run.run_dir / "provenance.json").is_file():
        pytest.skip("no provenance.json: the provenance capability is trimmed away")
    facts = json.loads((run.run_dir / "provenance.json").read_text())
    [offline] = sorted((run.run_dir / "wandb").glob("offline-run-*"))
    wandb_run = OfflineRun(offline)
    assert wandb_run.config["provenance"]["code"] == facts["code"]
    assert wandb_run.config["provenance"]["seed"] == wandb_run.config["seed"] == 0


@pytest.mark.slow  # trains in a subprocess that is killed, then resumes
def test_after_a_sigkill_and_a_resume_the_wandb_files_hold_every_step_once(run_train, tmp_path, monkeypatch):
    """However little of the killed part W&B's service had written to disk."""
    local_wandb(monkeypatch, tmp_path / "wandb-home")
    monkeypatch.setenv("WANDB_MODE", "offline")
    killed, _, expected = killed_and_resumed(run_train, monkeypatch, "logger=wandb")
    parts = sorted((killed.run_dir / "wandb").glob("offline-run-*"))
    rows = [row for part in parts for row in OfflineRun(part).history]
    held = sorted((key, row["step"]) for row in rows for key in row if key in {key for key, _ in expected})
    on_disk = {str(file.relative_to(killed.run_dir)): file.stat().st_size for file in killed.run_dir.rglob("*.wandb")}
    said = [line for line in (killed.run_dir / "train.log").read_text().splitlines() if "W&B" in line]
    assert held == expected, f"W&B files {on_disk}; train.log says {said}"
    syncs = [part for part in parts if any(next(read_records(file), None) for file in part.glob("run-*.wandb"))]
    assert f"wandb sync {' '.join(map(str, syncs))}\n" in (killed.run_dir / "train.log").read_text()


@pytest.mark.slow  # two processes under torchrun
def test_under_torchrun_rank_0_alone_writes_the_wandb_run(tmp_path, monkeypatch):
    local_wandb(monkeypatch, tmp_path / "wandb-home")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    overrides = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.progress_bar=false"]
    command = [*torchrun, str(ROOT / "train.py"), *overrides, "logger=wandb", "logger.mode=offline"]
    environment = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}  # a service of its own
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = list((tmp_path / "outputs" / "runs").iterdir())
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").logger.trackers.wandb
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
