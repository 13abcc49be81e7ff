"""Weights & Biases (logger=wandb)."""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from trainkit.config.schema import number, one_of, string
from trainkit.tracking.loggers.base import Logger, OncePerStep, RunFacts
from trainkit.tracking.loggers.wandb_files import held_history, holds_records

if TYPE_CHECKING:
    from torch import Tensor

WANDB_MODES = ("offline", "online", "disabled")
CONFIG_RULES = {  # gathered by the config check: conf/logger/wandb.yaml's _checks_
    "logger.mode": one_of(*WANDB_MODES),
    "logger.project": string(),
    "logger.init_timeout": number(above=0),
}

log = logging.getLogger(__name__)


def build(cfg: DictConfig, run_dir: Path, facts: RunFacts) -> Logger:
    """A resumed run continues its W&B run, given metrics.jsonl's lines up to the checkpoint (trimmed by then)."""
    config = {**(facts.config or {}), "provenance": facts.provenance} if facts.provenance else facts.config
    resume_id = facts.resume_ids.get("wandb")
    history = read_jsonl(run_dir / "metrics.jsonl") if resume_id else None
    return WandbLogger(cfg, run_dir, config, facts.run_name, facts.group, resume_id, history)


def read_jsonl(path: Path) -> list[dict]:
    """metrics.jsonl's objects, in order; none for a missing file; a torn last line (a kill) is left out."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


class WandbLogger(Logger):
    """Weights & Biases, offline by default: the run lands in `<run_dir>/wandb/offline-run-*`, and when it finishes one
    log line names that folder and the `wandb sync <folder>` command that uploads it. W&B is a guest: if it cannot start
    or later fails, one warning says so and training goes on with metrics.jsonl alone.

    Every metrics dict becomes its own W&B history row, plotted against our `step` metric (`define_metric("*",
    step_metric="step")`) rather than W&B's internal counter: W&B drops a `log(..., step=s)` whose s is below its
    current step, which would lose the epoch metrics logged at the same step as the last step-level loss, and every
    point re-logged after a resume from an earlier checkpoint.

    Each metric is logged once a step (OncePerStep). A resumed offline run writes a part of its own (another offline-run
    folder, the same run id), and W&B's service writes a part's file on its own schedule, so a part whose process was
    killed may hold less than it was given, or nothing (trainkit.tracking.loggers.wandb_files). So a resume reads what
    the earlier parts hold, logs into its part each metric of `history` (metrics.jsonl's lines up to the checkpoint)
    that they lack, and leaves out what they hold after the checkpoint; the done line lists only the parts that hold
    records.
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config: dict | None = None,
        run_name: str | None = None,
        group: str | None = None,
        resume_id: str | None = None,
        history: list[dict] | None = None,
    ):
        self.run = None
        self.offline_dir: Path | None = None  # <run_dir>/wandb/offline-run-<time>-<id>, for `wandb sync`
        self.log_images = cfg.get("log_images", True)
        self.once = OncePerStep()
        try:
            if resume_id and cfg.mode == "offline":  # what this run's earlier parts hold
                self.once = OncePerStep(held_history(offline_parts(run_dir / "wandb", resume_id)))
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
            for row in (history or []) if resume_id else []:  # what the earlier parts lack (all, if none holds it)
                self.log({key: value for key, value in row.items() if value is not None})  # null: not finite

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
            step = metrics.get("step", 0)
            values = self.once.new({key: value for key, value in metrics.items() if key not in ("epoch", "step")}, step)
            if not values:
                return
            try:
                self.run.log({**{key: metrics[key] for key in ("epoch", "step") if key in metrics}, **values})
            except Exception as error:
                self._fail("logging failed", error)

    def log_image(self, key: str, image: object, step: int) -> None:
        """`image`: a path to an image file or a uint8 array [H, W, 3]."""
        if self.run is not None and self.log_images:
            try:
                self.run.log({key: self.wandb.Image(str(image) if isinstance(image, Path) else image), "step": step})
            except Exception as error:
                self._fail("image logging failed", error)

    def log_text(self, key: str, text: str, step: int) -> None:
        """The text as a preformatted block (W&B's HTML panel: its lines and spaces as they are)."""
        if self.run is not None:
            import html

            try:
                self.run.log({key: self.wandb.Html(f"<pre>{html.escape(text)}</pre>"), "step": step})
            except Exception as error:
                self._fail("text logging failed", error)

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
                # A resumed offline run writes a folder of its own, under the same run id: each part
                # must be synced, in order (their names start with their start time).
                parts = [
                    part
                    for part in offline_parts(self.offline_dir.parent, run.id)
                    if part == self.offline_dir or holds_records(part)  # this one's file is written as it closes
                ] or [self.offline_dir]
                sync = "wandb sync " + " ".join(shlex.quote(str(part)) for part in parts)
                where = self.offline_dir if len(parts) == 1 else f"{len(parts)} parts in {self.offline_dir.parent}"
                log.info(f"W&B offline run in {where}; upload it with: {sync}")


def offline_parts(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline-run folders of one run, in the order they ran (their names start with their start time)."""
    return sorted(wandb_dir.glob(f"offline-run-*-{run_id}"))
