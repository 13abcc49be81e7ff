"""logger=mlflow, read back with MLflow's own client on the local file store."""

import pytest
from omegaconf import OmegaConf

from conftest import composed
from helpers import assert_one_config_error
from trainkit.tracking.loggers import build_loggers

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

CONFIG = {"seed": 0, "optimizer": {"lr": 0.1, "name": "sgd"}, "data": {"mean": [0.5]}, "resume": None}
PROVENANCE = {"code": "abc1234+dirty", "git": {"commit": "abc1234" * 5, "branch": "main", "dirty": True}}


def mlflow_cfg(tmp_path, **more):
    return OmegaConf.create(
        {"trackers": {"mlflow": True}, "tracking_uri": str(tmp_path / "mlruns"), "experiment": "tests", **more}
    )


def test_mlflow_shows_predictions_by_default():
    """A language model's text sample after each validation (task.sample_tokens), as an artifact."""
    assert composed("logger=mlflow").logger.log_predictions == 4


def test_mlflow_records_params_metrics_tags_artifacts_and_a_failed_status(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    loggers = build_loggers(mlflow_cfg(tmp_path), run_dir, config=CONFIG, provenance=PROVENANCE, run_name="lr=0.1")
    run_id = loggers.run_ids["mlflow"]
    loggers.log({"epoch": 0, "step": 5, "train/step_loss": 2.0})
    loggers.log({"epoch": 0, "step": 10, "val/acc": 0.5})
    loggers.summary({"best/val/acc": 0.5, "stop_reason": "non-finite loss"})
    loggers.finish(failed=True)
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "lr=0.1"
    assert run.data.params == {"seed": "0", "optimizer.lr": "0.1", "optimizer.name": "sgd", "data.mean": "[0.5]",
                               "resume": "None"}  # fmt: skip
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/step_loss")] == [(5, 2.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "best/val/acc")] == [(10, 0.5)]
    assert run.data.tags["mlflow.source.git.commit"] == "abc1234" * 5
    assert run.data.tags["provenance.code"] == "abc1234+dirty"
    assert [a.path for a in client.list_artifacts(run_id)] == ["summary.json"]


def test_mlflow_resume_continues_the_same_run(tmp_path):
    first = build_loggers(mlflow_cfg(tmp_path), tmp_path, config={"seed": 0})
    run_id = first.run_ids["mlflow"]
    first.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    first.finish(failed=True)  # stopped (preempted): resumed below
    second = build_loggers(
        mlflow_cfg(tmp_path), tmp_path, config={"seed": 0, "extra": 1}, resume_ids={"mlflow": run_id}
    )
    assert second.run_ids == {"mlflow": run_id}
    second.log({"epoch": 1, "step": 2, "val/acc": 0.75})
    second.finish()
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val/acc")] == [(1, 0.5), (2, 0.75)]
    assert client.get_run(run_id).data.params == {"seed": "0", "extra": "1"}
    assert len(client.search_runs([client.get_experiment_by_name("tests").experiment_id])) == 1


def test_mlflow_that_cannot_start_warns_and_training_goes_on(tmp_path, caplog):
    loggers = build_loggers(mlflow_cfg(tmp_path), tmp_path, resume_ids={"mlflow": "no-such-run"})
    loggers.log({"epoch": 0, "step": 1, "val/acc": 0.5})
    loggers.finish()
    assert "MLflow could not start" in caplog.text and "metrics.jsonl" in caplog.text
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_a_value_logged_again_at_the_same_step_is_held_once(tmp_path):
    """An epoch's last update logs `lr` with its step loss and again with the epoch metrics; the test
    metrics come with the last metrics line and again in the summary."""
    loggers = build_loggers(mlflow_cfg(tmp_path), tmp_path)
    loggers.log({"epoch": 0, "step": 8, "lr": 0.1, "train/step_loss": 2.0})
    loggers.log({"epoch": 0, "step": 8, "lr": 0.1, "train/loss": 1.9, "val/acc": 0.5})
    loggers.log({"epoch": 0, "step": 8, "test/acc": 0.75})
    loggers.summary({"best/val/acc": 0.5, "test/acc": 0.75, "stop_reason": "max_epochs"})
    loggers.finish()
    client, run_id = MlflowClient(f"file:{tmp_path / 'mlruns'}"), loggers.run_ids["mlflow"]
    for key in ("lr", "epoch", "test/acc", "best/val/acc"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [8], key


def test_mlflow_resume_does_not_log_again_what_a_killed_part_logged_after_the_checkpoint(tmp_path):
    first = build_loggers(mlflow_cfg(tmp_path), tmp_path)
    run_id = first.run_ids["mlflow"]
    for step in (1, 2, 3):  # the checkpoint stood at step 1; killed after step 3: no finish()
        first.log({"epoch": 0, "step": step, "train/step_loss": float(step)})
    second = build_loggers(mlflow_cfg(tmp_path), tmp_path, resume_ids={"mlflow": run_id}, resume_step=1)
    for step in (2, 3, 4):
        second.log({"epoch": 0, "step": step, "train/step_loss": float(step)})
    second.finish()
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train/step_loss")] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)
    ]  # fmt: skip
    assert sorted(m.step for m in client.get_metric_history(run_id, "epoch")) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["logger=mlflow", "logger.tracking_uri=3"], "logger.tracking_uri"),
        (["logger=mlflow", "logger.experiment=3"], "logger.experiment"),
    ],
)
def test_the_mlflow_keys_are_checked_beside_its_code(overrides, key):
    assert_one_config_error(overrides, key)
