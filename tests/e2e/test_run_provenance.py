"""Every run records where it came from: provenance.json, packages.txt and, for a dirty tree,
code.diff (trainkit.tracking.provenance; its details are tested in tests/unit/tracking); the start line and
every tracker show its facts."""

import json

import pytest

QUICK = ("trainer.max_epochs=1", "trainer.limit_train_batches=5", "trainer.progress_bar=false", "print_config=false")


def test_the_default_run_writes_provenance_and_names_its_commit(run_train):
    run = run_train(*QUICK, "trainer.deterministic=true")
    facts = json.loads((run.run_dir / "provenance.json").read_text())
    assert facts["overrides"] == [*QUICK, "trainer.deterministic=true"]
    assert (facts["world_size"], facts["seed"], facts["device"], facts["deterministic"]) == (1, 0, "cpu", True)
    assert (run.run_dir / "packages.txt").is_file()
    train_log = (run.run_dir / "train.log").read_text()
    if facts["code"] is not None:  # a git checkout (a copy without .git has no commit to name)
        assert f"(code {facts['code']}) -> {run.run_dir}" in train_log
        assert (run.run_dir / "code.diff").exists() == facts["git"]["dirty"]


def test_every_tracker_keeps_the_facts_of_provenance(run_train, tmp_path, monkeypatch):
    """W&B's run config (under `provenance`), TensorBoard's `provenance` text, MLflow's tags and artifacts."""
    for module in ("tensorboard", "mlflow", "wandb"):
        pytest.importorskip(module)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from helpers import OfflineRun, all_trackers_here

    store, trackers = tmp_path / "mlruns", all_trackers_here(tmp_path, monkeypatch)
    run = run_train(*QUICK, *trackers, isolated=True)  # W&B's service ends with the process that started it
    facts = json.loads((run.run_dir / "provenance.json").read_text())

    client = MlflowClient(f"file:{store}")
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert mlflow_run.data.tags["mlflow.source.git.commit"] == (facts["git"] or {}).get("commit", "")
    assert mlflow_run.data.tags["provenance.seed"] == "0"
    assert "provenance.json" in {artifact.path for artifact in client.list_artifacts(mlflow_run.info.run_id)}
    events = EventAccumulator(str(run.run_dir))
    events.Reload()
    assert "provenance/text_summary" in events.Tags()["tensors"]
    [offline] = sorted((run.run_dir / "wandb").glob("offline-run-*"))
    wandb_run = OfflineRun(offline)
    assert wandb_run.config["provenance"]["code"] == facts["code"]
    assert wandb_run.config["provenance"]["seed"] == wandb_run.config["seed"] == 0
