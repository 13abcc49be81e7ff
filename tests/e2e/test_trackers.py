"""End to end: a run with two trackers at once (logger=[tensorboard,mlflow]), stopped and resumed,
each tracker read back with its own reader."""

import os

import pytest
import torch

from conftest import ROOT

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
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}  # provenance's: test_run_provenance.py
    assert {"summary.json", "train_samples.png", "hydra"} <= artifacts

    events = EventAccumulator(str(first.run_dir))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val/acc")] == [
        (m["step"], pytest.approx(m["val/acc"])) for m in resumed.metrics if "val/acc" in m
    ]
    assert "train/samples" in events.Tags()["images"] and "config/text_summary" in events.Tags()["tensors"]
    assert events.Scalars("hparam/test/acc")[-1].value == pytest.approx(resumed.summary["test"]["test/acc"])
    assert not [p for p in os.listdir(first.run_dir) if p.replace(".", "").isdigit()]  # no timestamped hparams folder


@pytest.mark.slow  # trains in a subprocess that is killed, then resumes
def test_after_a_sigkill_and_a_resume_each_tracker_holds_every_step_once(run_train, tmp_path, monkeypatch):
    """Killed (SIGKILL: no handler, no `finally`) two updates after epoch 1's checkpoint, then resumed:
    TensorBoard, MLflow and the W&B offline run files each hold every metric of every step of
    metrics.jsonl once, however little of the killed part W&B's service had written to disk."""
    pytest.importorskip("wandb")
    from helpers import OfflineRun, all_trackers_here, read_records

    store, trackers = tmp_path / "mlruns", all_trackers_here(tmp_path, monkeypatch)
    per_epoch = ("trainer.limit_train_batches=4", "trainer.log_every_n_steps=1", "trainer.max_epochs=3")
    killer = ("model._target_=models_for_tests.KilledCNN", "+model.kill_at=11")  # the 3rd update of epoch 2
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    killed = run_train(*TINY[1:], *per_epoch, *trackers, "print_config=false", *killer, isolated=True, check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert max(m["step"] for m in killed.metrics) == 10  # steps 9 and 10 logged after epoch 1's checkpoint (step 8)
    resumed = run_train(f"resume={killed.run_dir}", run_dir=killed.run_dir, isolated=True)
    expected = sorted(
        {
            (key, m["step"])
            for m in resumed.metrics
            for key, value in m.items()
            if key not in ("epoch", "step") and value is not None
        }
    )  # a set: metrics.jsonl has `lr` in an epoch's last step line and again in its epoch line
    assert max(step for _, step in expected) == 12

    events = EventAccumulator(str(killed.run_dir), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = [tag for tag in events.Tags()["scalars"] if not tag.startswith("hparam/")]
    assert sorted((tag, e.step) for tag in tags for e in events.Scalars(tag)) == expected
    assert [image.step for image in events.Images("train/samples")] == [0]  # logged by the first part only

    client = MlflowClient(f"file:{store}")
    [run] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    held = [(key, m.step) for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
    assert sorted(item for item in held if item[0] != "epoch" and not item[0].startswith("best/")) == expected
    assert sorted(step for key, step in held if key == "epoch") == sorted({m["step"] for m in resumed.metrics})

    parts = sorted((killed.run_dir / "wandb").glob("offline-run-*"))
    rows = [row for part in parts for row in OfflineRun(part).history]
    held = sorted((key, row["step"]) for row in rows for key in row if key in {key for key, _ in expected})
    on_disk = {str(file.relative_to(killed.run_dir)): file.stat().st_size for file in killed.run_dir.rglob("*.wandb")}
    said = [line for line in (killed.run_dir / "train.log").read_text().splitlines() if "W&B" in line]
    assert held == expected, f"W&B files {on_disk}; train.log says {said}"
    syncs = [part for part in parts if any(next(read_records(file), None) for file in part.glob("run-*.wandb"))]
    assert f"wandb sync {' '.join(map(str, syncs))}\n" in (killed.run_dir / "train.log").read_text()
