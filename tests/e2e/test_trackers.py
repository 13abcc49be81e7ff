"""End to end: a run with two trackers at once (logger=[tensorboard,mlflow]), stopped and resumed,
each tracker read back with its own reader."""

import json
import os

import pytest
import torch

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TINY = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.progress_bar=false")


def test_tensorboard_and_mlflow_in_one_run_continue_on_resume(run_train, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "mlruns"
    trackers = ("logger=[tensorboard,mlflow]", f"logger.tracking_uri={store}", "logger.experiment=e2e")
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
    provenance = json.loads((first.run_dir / "provenance.json").read_text())
    assert run.data.tags["mlflow.source.git.commit"] == (provenance["git"] or {}).get("commit", "")
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert {"summary.json", "provenance.json", "train_samples.png", "hydra"} <= artifacts

    events = EventAccumulator(str(first.run_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val/acc")] == [
        (m["step"], pytest.approx(m["val/acc"])) for m in resumed.metrics if "val/acc" in m
    ]
    assert "train/samples" in events.Tags()["images"] and "provenance/text_summary" in events.Tags()["tensors"]
    assert events.Scalars("hparam/test/acc")[-1].value == pytest.approx(resumed.summary["test"]["test/acc"])
    assert not [p for p in os.listdir(first.run_dir) if p.replace(".", "").isdigit()]  # no timestamped hparams folder
