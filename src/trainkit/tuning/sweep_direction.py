"""An Optuna search whose direction fights its metric (maximizing a loss) wastes every trial: refused at the first.

    python train.py hparams_search=digits_optuna             # Optuna TPE (conf/hparams_search/)

Hydra's basic sweeper has no direction. train.py reaches every trial of a multirun through `checking_direction`.
"""

from collections.abc import Callable
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.resume import in_multirun
from trainkit.errors import ConfigError
from trainkit.tasks.task import higher_is_better

Result = TypeVar("Result")


def checking_direction(trial: Callable[[DictConfig], Result]) -> Callable[[DictConfig], Result]:
    """`trial(cfg)`, in a multirun after check_direction against the running sweeper: train.py's one call site."""

    def checked(cfg: DictConfig) -> Result:
        if in_multirun():
            check_direction(cfg, sweeper_direction())
        return trial(cfg)

    return checked


def sweeper_direction() -> str | None:
    """The single direction ('maximize'/'minimize') of the running Hydra sweeper, if it has one."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    # HydraConfig.get() is a DictConfig; hydra annotates it as the HydraConf dataclass behind it.
    direction = OmegaConf.select(HydraConfig.get(), "sweeper.direction", default=None)  # type: ignore[arg-type]
    if direction is None or OmegaConf.is_list(direction) or isinstance(direction, (list, tuple)):
        return None  # not Optuna, or a multi-objective study
    return getattr(direction, "name", str(direction))


def check_direction(cfg: DictConfig, direction: str | None) -> None:
    """A sweep that maximizes a loss (or minimizes an accuracy) wastes every trial: stop at once."""
    if direction not in ("maximize", "minimize"):
        return
    task = OmegaConf.select(cfg, "task._target_")
    wanted = "maximize" if higher_is_better(task, cfg.optimized_metric) else "minimize"
    if direction != wanted:
        raise ConfigError(
            "hydra.sweeper.direction",
            f"is {direction} but optimized_metric={cfg.optimized_metric} "
            f"should be {wanted}d; set hydra.sweeper.direction={wanted}",
        )
