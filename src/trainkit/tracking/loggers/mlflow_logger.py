"""MLflow (logger=mlflow): a local file store by default (outputs/mlruns, no server), or the server
that logger.tracking_uri names. MlflowClient, not mlflow's module-level API: no global active run,
no exit hooks; this logger alone decides when the run ends and how."""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from trainkit.config.schema import Relation, string
from trainkit.tracking.loggers.base import Logger, OncePerStep, RunFacts, flatten, is_number

MLFLOW_INSTALL = "pip install 'trainkit[mlflow]' (or: pip install mlflow-skinny)"
PARAM_LENGTH = 6000  # MLflow's limit on a param's value (its own check raises above it)
TAG_LENGTH = 5000
BATCH = 100  # params or tags a log_batch call; MLflow refuses more

log = logging.getLogger(__name__)


CONFIG_RULES = {"logger.tracking_uri": string(), "logger.experiment": string()}  # conf/logger/mlflow.yaml's _checks_


def _installed(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    """MLflow is an optional extra: a missing install is found with the config, before any data is read."""
    if cfg.logger.trackers.get("mlflow") and importlib.util.find_spec("mlflow") is None:
        yield "logger.trackers", f"logger=mlflow needs MLflow, which is not installed: {MLFLOW_INSTALL}"


CONFIG_RELATIONS = (Relation(("logger.trackers",), _installed),)


def build(cfg: DictConfig, run_dir: Path, facts: RunFacts) -> Logger:
    resume_id = facts.resume_ids.get("mlflow")
    return MlflowLogger(cfg, run_dir, facts.config, facts.provenance, facts.run_name, resume_id, facts.resume_step)


def store_uri(uri: str) -> str:
    """A URI as given (http://..., sqlite:///...), or a local folder as a file: URI. MLflow 3 keeps
    its file store in maintenance and refuses it unless MLFLOW_ALLOW_FILE_STORE is set: the file
    store is what lets a run be tracked with no server or database to set up, so it is allowed here."""
    if "://" in uri and not uri.startswith("file:"):
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri if uri.startswith("file:") else Path(uri).resolve().as_uri()


def provenance_tags(provenance: dict) -> dict[str, str]:
    """MLflow's own tags (the UI shows the commit and the source) and every fact as provenance.<key>."""
    git = provenance.get("git") or {}
    tags = {
        "mlflow.source.git.commit": git.get("commit"),
        "mlflow.source.git.branch": git.get("branch"),
        "mlflow.source.git.repoURL": git.get("remote"),
        "mlflow.source.name": " ".join(provenance.get("command") or []) or None,
        "mlflow.source.type": "LOCAL",
        "mlflow.user": provenance.get("user"),
    }
    tags.update({f"provenance.{key}": value for key, value in flatten(provenance).items()})
    return {key: str(value)[:TAG_LENGTH] for key, value in tags.items() if value is not None}


class MlflowLogger(Logger):
    """Params (the flattened config), metrics with their step, provenance as tags, the run's files as artifacts at the
    end, the same run continued on a resume (its id is in the checkpoint), status FAILED when training failed. A guest,
    like W&B: if MLflow fails, one warning says so and training goes on with metrics.jsonl alone.

    MLflow's history only grows (its client can neither delete nor replace a value), so each metric is logged once a
    step (OncePerStep): a resume from `resume_step` reads what the run's history holds from that step on (the steps a
    stopped or killed part logged after its checkpoint) and logs only the rest."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config: dict | None,
        provenance: dict | None,
        run_name: str | None,
        resume_id: str | None,
        resume_step: int | None = None,
    ):
        self.run_dir, self.run_id = run_dir, None
        self.client: Any = None  # MlflowClient once started; None after a failure or finish
        self.step = 0
        self.last_values: dict = {}
        self.log_images = cfg.get("log_images", True)
        self.once = OncePerStep()
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as error:  # trainkit.config.rules checks this before the run; here for other callers
            raise ImportError(f"logger=mlflow needs MLflow, which is not installed: {MLFLOW_INSTALL}") from error
        self.Metric = Metric
        try:
            self.client = MlflowClient(tracking_uri=store_uri(str(cfg.tracking_uri)))
            if resume_id:
                self.client.update_run(resume_id, status="RUNNING")  # the first part's run, continued
                self.run_id = resume_id
                known = self.client.get_run(resume_id).data.params
                self.once = OncePerStep(self._held_from(resume_step or 0))
            else:
                experiment = self.client.get_experiment_by_name(cfg.experiment)
                experiment_id = (
                    experiment.experiment_id if experiment else self.client.create_experiment(cfg.experiment)
                )
                self.run_id = self.client.create_run(experiment_id, run_name=run_name or run_dir.name).info.run_id
                known = {}
            # MLflow refuses to change a param's value: a resume logs only the params the first part did not.
            params = [
                Param(key, str(value)[:PARAM_LENGTH])
                for key, value in flatten(config or {}).items()
                if key not in known
            ]
            tags = [RunTag(key, value) for key, value in provenance_tags(provenance or {}).items()]
            tags.append(RunTag("trainkit.run_dir", str(run_dir.resolve())))
            for start in range(0, max(len(params), len(tags)), BATCH):
                self.client.log_batch(
                    self.run_id, params=params[start : start + BATCH], tags=tags[start : start + BATCH]
                )
        except Exception as error:
            self._fail("could not start", error)

    def _held_from(self, first_step: int) -> dict[int, set[str]]:
        """{step: metric names} that the run's history holds at `first_step` and after."""
        held: dict[int, set[str]] = {}
        for key in self.client.get_run(self.run_id).data.metrics:
            for metric in self.client.get_metric_history(self.run_id, key):
                if metric.step >= first_step:
                    held.setdefault(metric.step, set()).add(key)
        return held

    def _fail(self, what: str, error: Exception) -> None:
        first_line = (str(error).strip().splitlines() or [""])[0]
        log.warning(
            f"MLflow {what} ({type(error).__name__}: {first_line}); "
            "training continues with local logging only (metrics.jsonl)"
        )
        self.client = None

    def log(self, metrics: dict) -> None:
        if self.client is None:
            return
        now, step = int(time.time() * 1000), metrics.get("step", 0)
        self.step = step
        numbers = {key: value for key, value in metrics.items() if key != "step" and is_number(value)}
        values = [self.Metric(key, float(value), now, step) for key, value in self.once.new(numbers, step).items()]
        if not values:
            return
        try:
            self.client.log_batch(self.run_id, metrics=values)
        except Exception as error:
            self._fail("logging failed", error)

    def log_image(self, key: str, image: object, step: int) -> None:
        if self.client is None or not self.log_images:
            return
        try:
            if isinstance(image, Path):
                self.client.log_artifact(self.run_id, str(image), "images")
            else:
                self.client.log_image(self.run_id, image, artifact_file=f"images/{key.replace('/', '_')}_{step}.png")
        except Exception as error:
            self._fail("image logging failed", error)

    def log_text(self, key: str, text: str, step: int) -> None:
        """An artifact a step: text/<key>_<step>.txt."""
        if self.client is None:
            return
        try:
            self.client.log_text(self.run_id, text, f"text/{key.replace('/', '_')}_{step}.txt")
        except Exception as error:
            self._fail("text logging failed", error)

    def summary(self, values: dict) -> None:
        self.last_values = values  # logged at finish, at the run's last step

    def finish(self, failed: bool = False) -> None:
        client, self.client = self.client, None  # at most once, even when called again from a `finally`
        if client is None:
            return
        try:
            now = int(time.time() * 1000)
            numbers = {key: value for key, value in self.last_values.items() if is_number(value)}
            summary = [
                self.Metric(key, float(value), now, self.step)
                for key, value in self.once.new(numbers, self.step).items()
            ]
            if summary:  # best/<metric>: the test metrics came with the last log() (OncePerStep leaves them out)
                client.log_batch(self.run_id, metrics=summary)
            for path in run_artifacts(self.run_dir):
                client.log_artifact(self.run_id, str(path), "hydra" if path.parent.name == ".hydra" else None)
            client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        except Exception as error:
            log.warning(f"MLflow could not finish the run ({type(error).__name__}: {error})")


def run_artifacts(run_dir: Path) -> list[Path]:
    """The run's record, small files only: config, summary, provenance, pictures (not checkpoints)."""
    names = ("summary.json", "provenance.json", "packages.txt", "code.diff", "config_tree.txt", "train.log")
    files = [run_dir / name for name in names] + [
        run_dir / ".hydra" / name for name in ("config.yaml", "overrides.yaml")
    ]
    return [path for path in files if path.is_file()] + sorted(run_dir.glob("*.png"))
