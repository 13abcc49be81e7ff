"""What every logger answers, and the strict JSON metrics.jsonl and summary.json are written in."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config check imports this package for its names: it need not import torch
    from torch import Tensor


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


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"optimizer.lr": 0.1, ...}: a nested config as dotted keys (lists stay whole), for trackers
    that keep flat hyperparameters (TensorBoard's hparams, MLflow's params)."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


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
