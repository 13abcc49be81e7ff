"""What every logger answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:  # the config check imports this package for its names: it need not import torch
    from torch import Tensor


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"optimizer.lr": 0.1, ...}: a nested config as dotted keys (lists stay whole), for flat hyperparameters."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def is_number(value: Any) -> bool:
    """What a tracker plots: ints and floats (a bool is an int to Python, not a metric)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class OncePerStep:
    """Each metric goes into a tracker's history once a step, for a tracker whose history cannot forget (MLflow, W&B):
    the loop logs some values twice at one step (`lr`, the test metrics), and a resumed run logs again what its
    killed part logged after the checkpoint. `held`: {step: metric names} the history holds already."""

    def __init__(self, held: Mapping[int, set[str]] | None = None):
        self.held = {step: set(names) for step, names in (held or {}).items()}
        self.step: int | None = None
        self.names: set[str] = set()

    def new(self, metrics: Mapping[str, Any], step: int) -> dict[str, Any]:
        """The metrics of `metrics` that the tracker does not hold at `step` yet; from now on it does."""
        if step != self.step:  # steps come in order: only the current step's names are kept
            self.step, self.names = step, self.held.pop(step, set())
        fresh = {name: value for name, value in metrics.items() if name not in self.names}
        self.names.update(fresh)
        return fresh


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

    def log_text(self, key: str, text: str, step: int) -> None:
        """A piece of text at `step` (a language model's sample after each validation); nothing by default."""

    def summary(self, values: dict) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


@dataclass(frozen=True)
class RunFacts:
    """What a tracker may keep of the run; on a resume, the checkpoint's {tracker: run id} and step."""

    config: dict | None = None
    provenance: dict | None = None
    run_name: str | None = None
    group: str | None = None
    resume_ids: Mapping[str, str | None] = field(default_factory=dict)
    resume_step: int | None = None


def run_names(hydra_cfg: Any = None, run_dir: Path | None = None) -> tuple[str | None, str | None]:
    """(run name, group) for the trackers from Hydra's config: `hydra_cfg`, the current one, or `run_dir`'s
    .hydra/hydra.yaml (a DDP worker has none of its own); (None, None) without one. The name is what the command line
    changed (`optimizer.lr=0.1,seed=1`) or the run directory's name; the group, a multirun's sweep directory's name."""
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
        # The saved file keeps sweep.dir unresolved (`${now:...}` would give a new time): use the job directory's
        # parent, which is the sweep directory for the default `subdir`.
        saved = from_file and output_dir
        sweep_dir = Path(str(output_dir)).parent if saved else OmegaConf.select(hydra_cfg, "sweep.dir", default=None)
        group = Path(str(sweep_dir)).name if sweep_dir else None
    return run_name or None, group
