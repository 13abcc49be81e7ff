"""logger=mlflow end to end: a run stopped and resumed continues its MLflow run, and one killed and resumed holds
every step once, read back with MLflow's own client; the run keeps the facts of provenance.json (its tags and
artifact)."""

import json

import pytest
import torch

from helpers import killed_and_resumed

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient

TINY = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.progress_bar=false")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store of the test's own, that the runs get as logger.tracking_uri."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the reader here (trainkit sets it in the runs)
    return tmp_path / "mlruns"


def test_mlflow_continues_the_same_run_on_resume(run_train, store):
    trackers = ("logger=mlflow", f"logger.tracking_uri={store}", "logger.experiment=e2e")
    first = run_train(*TINY, *trackers, "trainer.max_epochs=1")
    run_id = torch.load(first.run_dir / "checkpoints" / "last.pt", weights_only=True)["mlflow_run_id"]
    resumed = run_train(f"resume={first.run_dir}", "trainer.max_epochs=2", run_dir=first.run_dir)
    assert resumed.summary["epochs"] == 2

    client = MlflowClient(f"file:{store}")
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert [run.info.run_id for run in runs] == [run_id]  # the resume continued the same run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.params["trainer.max_epochs"] == "1"
    assert [m.step for m in client.get_metric_history(run_id, "val/acc")] == [2, 4]
    assert run.data.metrics["test/acc"] == resumed.summary["test"]["test/acc"]
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert {"summary.json", "train_samples.png", "hydra"} <= artifacts
    provenance = first.run_dir / "provenance.json"  # none where the provenance capability is trimmed away
    if provenance.is_file():
        facts = json.loads(provenance.read_text())
        assert run.data.tags["mlflow.source.git.commit"] == (facts["git"] or {}).get("commit", "")
        assert run.data.tags["provenance.seed"] == "0" and "provenance.json" in artifacts


@pytest.mark.slow  # trains in a subprocess that is killed, then resumes
def test_after_a_sigkill_and_a_resume_mlflow_holds_every_step_once(run_train, monkeypatch, store):
    trackers = ("logger=mlflow", f"logger.tracking_uri={store}", "logger.experiment=e2e")
    _, resumed, expected = killed_and_resumed(run_train, monkeypatch, *trackers)
    client = MlflowClient(f"file:{store}")
    [run] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    held = [(key, m.step) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
    assert sorted(item for item in held if item[0] != "epoch" and not item[0].startswith("best/")) == expected
    assert sorted(step for key, step in held if key == "epoch") == sorted({m["step"] for m in resumed.metrics})
