"""Where metrics go: metrics.jsonl always (the run's record), plus the tracker chosen by `logger`.

train.py talks to one `Loggers` object: `log(metrics)` for every metrics dict (each carries
`epoch` and `step`), `log_image(key, image, step)`, `log_masks(...)` for images with their true and
predicted masks (trainkit.tracking.prediction_images), `summary(values)` for the run's headline
numbers, and `finish(failed=...)` in a `finally`. A tracker that has no use for a call ignores it.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:  # the config check imports this module for its names: it need not import torch
    from torch import Tensor

LOGGERS = ("none", "csv", "wandb")
WANDB_MODES = ("offline", "online", "disabled")

log = logging.getLogger(__name__)


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float inside (dicts, lists) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """JSON that strict readers accept: null, never the bare NaN or Infinity Python writes."""
    return json.dumps(finite_or_null(value), indent=indent, allow_nan=False)


class Logger:
    """What every logger answers; the defaults do nothing, so each logger writes only what it keeps."""

    run_id: str | None = None  # a tracker's own run id, stored in checkpoints to resume the same run

    def log(self, metrics: dict) -> None:
        pass

    def log_image(self, key: str, image: object, step: int) -> None:
        pass

    def log_masks(
        self, key: str, images: Tensor, true_masks: Tensor, predicted_masks: Tensor, class_names: list[str], step: int
    ) -> None:
        """`images`: uint8 RGB [N, H, W, 3]; the masks: class indices [N, H, W]; all on the CPU."""

    def summary(self, values: dict) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


class JsonlLogger(Logger):
    """One JSON object a line, appended and flushed as it comes, so a crashed run keeps its history."""

    def __init__(self, path: Path):
        # Open for the whole run (closed in finish): a line is flushed as each metric comes in.
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def log(self, metrics: dict) -> None:
        self.file.write(strict_json(metrics) + "\n")
        self.file.flush()

    def finish(self, failed: bool = False) -> None:
        self.file.close()


class CsvLogger(Logger):
    """A table with one column per metric. Columns appear as metrics do, so the file is rewritten
    on each log; runs log at most a few thousand rows, which keeps that cheap. Appended to, as
    metrics.jsonl is: a resume keeps the rows before it (resume trims those written after its checkpoint)."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        self.columns: list[str] = []
        if path.is_file():  # the cells come back as text, and are written back unchanged
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                self.columns, self.rows = list(reader.fieldnames or []), list(reader)

    def log(self, metrics: dict) -> None:
        self.rows.append(metrics)
        self.columns += [k for k in metrics if k not in self.columns]
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(self.rows)


class WandbLogger(Logger):
    """Weights & Biases, offline by default: the run lands in `<run_dir>/wandb/offline-run-*`, and
    when it finishes one log line names that folder and the `wandb sync <folder>` command that
    uploads it. W&B is a guest: if it cannot start or later fails, one warning says so and
    training goes on with metrics.jsonl alone.

    Every metrics dict becomes its own W&B history row, plotted against our `step` metric
    (`define_metric("*", step_metric="step")`) rather than W&B's internal counter: W&B drops a
    `log(..., step=s)` whose s is below its current step, which would lose the epoch metrics
    logged at the same step as the last step-level loss, and every point re-logged after a
    resume from an earlier checkpoint.
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config: dict | None = None,
        run_name: str | None = None,
        group: str | None = None,
        resume_id: str | None = None,
    ):
        self.run = None
        self.offline_dir: Path | None = None  # <run_dir>/wandb/offline-run-<time>-<id>, for `wandb sync`
        self.log_images = cfg.get("log_images", True)
        try:
            import wandb  # here, not at the top: importing wandb costs about half a second

            self.wandb = wandb
            self.run = wandb.init(
                # Explicit: W&B reads WANDB_MODE once per process, and offline must never prompt.
                mode=cfg.mode,
                dir=str(run_dir),
                project=cfg.get("project"),
                entity=cfg.get("entity"),
                # A resumed run keeps its name and group unless the config names them.
                group=cfg.get("group") or (None if resume_id else group),
                name=cfg.get("run_name") or (None if resume_id else run_name),
                tags=list(cfg.get("tags") or []),
                notes=cfg.get("notes"),
                config=config,
                id=resume_id,
                resume="allow" if resume_id else None,
                # train.log already holds the console; silent drops W&B's banner lines.
                settings=wandb.Settings(silent=True, console="off", init_timeout=cfg.get("init_timeout", 90)),
            )
            self.run.define_metric("*", step_metric="step")
        except Exception as error:  # a bad key, no network, a broken install: none may stop training
            self._fail("could not start", error)
            return
        if cfg.mode != "disabled":
            self.run_id = self.run.id
        if cfg.mode == "offline":
            sync_dir = getattr(getattr(self.run, "settings", None), "sync_dir", None)
            self.offline_dir = Path(sync_dir) if sync_dir else None

    def _fail(self, what: str, error: Exception) -> None:
        first_line = (str(error).strip().splitlines() or [""])[0]
        log.warning(
            f"W&B {what} ({type(error).__name__}: {first_line}); "
            "training continues with local logging only (metrics.jsonl)"
        )
        if self.run is not None:
            self.finish(failed=True)

    def log(self, metrics: dict) -> None:
        if self.run is not None:
            try:
                self.run.log(metrics)
            except Exception as error:
                self._fail("logging failed", error)

    def log_image(self, key: str, image: object, step: int) -> None:
        """`image`: a path to an image file or a uint8 array [H, W, 3] (see trainkit.tracking.images)."""
        if self.run is not None and self.log_images:
            try:
                self.run.log({key: self.wandb.Image(str(image) if isinstance(image, Path) else image), "step": step})
            except Exception as error:
                self._fail("image logging failed", error)

    def log_masks(
        self, key: str, images: Tensor, true_masks: Tensor, predicted_masks: Tensor, class_names: list[str], step: int
    ) -> None:
        """One W&B image an image, its true and predicted masks laid over it (each shown or hidden,
        and coloured by class, in the W&B UI), the classes named by `class_names`."""
        if self.run is None:
            return
        labels = dict(enumerate(class_names))
        try:
            pictures = [
                self.wandb.Image(
                    image.numpy(),
                    masks={
                        "ground_truth": {"mask_data": true.numpy(), "class_labels": labels},
                        "predictions": {"mask_data": predicted.numpy(), "class_labels": labels},
                    },
                )
                for image, true, predicted in zip(images, true_masks, predicted_masks)
            ]
            self.run.log({key: pictures, "step": step})
        except Exception as error:
            self._fail("image logging failed", error)

    def summary(self, values: dict) -> None:
        if self.run is not None:
            try:
                self.run.summary.update(values)
            except Exception as error:
                self._fail("summary update failed", error)

    def finish(self, failed: bool = False) -> None:
        run, self.run = self.run, None  # at most once, even when called again from a `finally`
        if run is not None:
            try:
                run.finish(exit_code=1 if failed else 0)
            except Exception as error:
                log.warning(f"W&B could not finish the run ({type(error).__name__}: {error})")
                return
            if self.offline_dir is not None:
                sync = f"wandb sync {shlex.quote(str(self.offline_dir))}"
                log.info(f"W&B offline run in {self.offline_dir}; upload it with: {sync}")


class Loggers:
    """Fans every call out to each logger, so train.py logs once."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    @property
    def run_id(self) -> str | None:
        """The tracker's run id (W&B), or None; train.py keeps it in checkpoints to resume that run."""
        return next((logger.run_id for logger in self.loggers if getattr(logger, "run_id", None)), None)

    def log(self, metrics: dict) -> None:
        for logger in self.loggers:
            logger.log(metrics)

    def log_image(self, key: str, image: object, step: int) -> None:
        for logger in self.loggers:
            logger.log_image(key, image, step)

    def log_masks(
        self, key: str, images: Tensor, true_masks: Tensor, predicted_masks: Tensor, class_names: list[str], step: int
    ) -> None:
        for logger in self.loggers:
            logger.log_masks(key, images, true_masks, predicted_masks, class_names, step)

    def summary(self, values: dict) -> None:
        for logger in self.loggers:
            logger.summary(values)

    def finish(self, failed: bool = False) -> None:
        for logger in self.loggers:
            logger.finish(failed=failed)


def build_loggers(
    cfg: DictConfig,
    run_dir: Path,
    config: dict | None = None,
    run_name: str | None = None,
    group: str | None = None,
    resume_id: str | None = None,
) -> Loggers:
    """metrics.jsonl plus the tracker `cfg.name`. `config` (a plain dict: the resolved run config),
    `run_name`, `group` and `resume_id` go to W&B; see `wandb_names` for the names. trainkit.config.validation
    checked `cfg.name` (one of LOGGERS) and `cfg.mode` (one of WANDB_MODES)."""
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    if cfg.name == "csv":
        loggers.append(CsvLogger(run_dir / cfg.get("filename", "metrics.csv")))
    elif cfg.name == "wandb":
        loggers.append(WandbLogger(cfg, run_dir, config=config, run_name=run_name, group=group, resume_id=resume_id))
    return Loggers(loggers)


def wandb_names(hydra_cfg: Any = None, run_dir: Path | None = None) -> tuple[str | None, str | None]:
    """(run name, group) for W&B from Hydra's config: `HydraConfig.get()`, or None for the current
    one, or else the `.hydra/hydra.yaml` Hydra wrote into `run_dir` (a DDP worker process that
    train.py spawned has no HydraConfig of its own).

    The run name is what the command line changed (`optimizer.lr=0.1,seed=1`), else the run
    directory's name; the group is the sweep directory's name in a multirun, so a sweep's jobs
    sit together, else None. With no Hydra config at all (tests, notebooks) both are None.
    """
    from_file = False
    if hydra_cfg is None:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            hydra_cfg = HydraConfig.get()
        elif run_dir is not None and (Path(run_dir) / ".hydra" / "hydra.yaml").is_file():
            hydra_cfg, from_file = OmegaConf.load(Path(run_dir) / ".hydra" / "hydra.yaml").hydra, True
        else:
            return None, None
    if not isinstance(hydra_cfg, DictConfig):
        hydra_cfg = OmegaConf.create(hydra_cfg)
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None)
    run_name = OmegaConf.select(hydra_cfg, "job.override_dirname", default=None) or (
        Path(str(output_dir)).name if output_dir else None
    )
    group = None
    mode = OmegaConf.select(hydra_cfg, "mode", default=None)
    if getattr(mode, "name", mode) == "MULTIRUN":
        # The saved file keeps sweep.dir unresolved (`${now:...}` would give a new time): use the
        # job directory's parent, which is the sweep directory for the default `subdir`.
        sweep_dir = (
            Path(str(output_dir)).parent
            if from_file and output_dir
            else (OmegaConf.select(hydra_cfg, "sweep.dir", default=None))
        )
        group = Path(str(sweep_dir)).name if sweep_dir else None
    return run_name or None, group
