"""TensorBoard (logger=tensorboard): event files in the run directory itself, so
`tensorboard --logdir outputs/runs` lists each run under its own folder's name."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainkit.tracking.loggers.base import Logger, OncePerStep, RunFacts, flatten, is_number


def build(cfg: DictConfig, run_dir: Path, facts: RunFacts) -> Logger:
    return TensorBoardLogger(cfg, run_dir, facts.config, facts.provenance, facts.resume_step)


def hparam_value(value: Any) -> int | float | str | bool:
    """What TensorBoard's hparams accept: numbers, strings, booleans; the rest as its text."""
    return value if isinstance(value, (bool, int, float, str)) else json.dumps(value)


class TensorBoardLogger(Logger):
    """Scalars under metrics.jsonl's names against the optimizer step, images, the config and the
    provenance as text at the start, and the hyperparameters with the final metrics at the end."""

    def __init__(
        self, cfg: DictConfig, run_dir: Path, config: dict | None, provenance: dict | None, resume_step: int | None
    ):
        from torch.utils.tensorboard import SummaryWriter  # here: importing tensorboard costs about a second

        self.log_images = cfg.get("log_images", True)
        self.log_dir = run_dir.resolve()
        self.config = config or {}
        # A resume appends to the same folder; purge_step hides what an earlier part logged after the
        # checkpoint's step, which this part logs again (as metrics.jsonl is trimmed).
        purge_step = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        self.step = step = resume_step or 0
        self.once = OncePerStep()  # `lr` comes with an epoch's last update and again with its epoch metrics
        if config:
            # Four leading spaces: TensorBoard renders text as Markdown, and this keeps it verbatim.
            self.writer.add_text("config", indented(OmegaConf.to_yaml(config)), step)
        if provenance:
            self.writer.add_text("provenance", indented(json.dumps(provenance, indent=2)), step)

    def log(self, metrics: dict) -> None:
        self.step = step = metrics.get("step", 0)
        scalars = {key: value for key, value in metrics.items() if key not in ("epoch", "step") and is_number(value)}
        for key, value in self.once.new(scalars, step).items():
            self.writer.add_scalar(key, value, step)

    def log_image(self, key: str, image: object, step: int) -> None:
        """`image`: a path to an image file or a uint8 array [H, W, 3]."""
        if not self.log_images:
            return
        if isinstance(image, Path):
            import numpy as np
            from PIL import Image

            with Image.open(image) as picture:
                image = np.asarray(picture.convert("RGB"))
        self.writer.add_image(key, image, step, dataformats="HWC")

    def log_text(self, key: str, text: str, step: int) -> None:
        self.writer.add_text(key, indented(text), step)  # verbatim (indented: not read as Markdown)

    def summary(self, values: dict) -> None:
        """The hyperparameters (the flattened config) beside the final metrics, in the HPARAMS tab.
        run_name is this run's own folder (an absolute path joined to the logdir is itself), not the
        timestamped subfolder add_hparams makes by default (pytorch #32651)."""
        metrics = {
            f"hparam/{key}": value
            for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        }
        hparams = {key: hparam_value(value) for key, value in flatten(self.config).items()}
        self.writer.add_hparams(hparams, metrics, run_name=str(self.log_dir), global_step=self.step)

    def finish(self, failed: bool = False) -> None:
        self.writer.close()  # flushes; closing twice is harmless


def indented(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.splitlines())
