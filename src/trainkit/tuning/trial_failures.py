"""A failed trial costs one trial, not the sweep; a search over a key the run does not read stops at once.

    python train.py -m optimizer.lr=1.0,0.1,0.01 seed=1,2     # a diverging LR fails its trials alone

train.py reaches a trial through `catching_failures`, on a line the trial_failures row marks: without this
module a multirun's trial runs plain, and the first one that crashes ends the sweep.

A trial that crashes (a diverging learning rate, an out-of-memory batch size) should cost one
trial, not the sweep: `run_trial` logs the error, writes the traceback to the trial's log file
and returns `failed_trial_value(cfg)` to the sweeper. A single run (no -m) raises as usual.
"""

import functools
import gc
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.resume import in_multirun
from trainkit.config.schema import flag, number
from trainkit.errors import ConfigError, caused_by_config_error
from trainkit.tasks.task import higher_is_better

log = logging.getLogger("sweep")
# gathered by the config check: conf/config.yaml's sweep._checks_
CONFIG_RULES = {"sweep.catch_failures": flag(), "sweep.failed_trial_value": number(null=True)}


def catching_failures(trial: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """`trial(cfg)` run by run_trial: train.py's one call site."""
    return functools.partial(run_trial, trial)


def failed_trial_value(cfg: DictConfig) -> float:
    """What a failed trial reports to the sweeper: `sweep.failed_trial_value`, or when that is null
    the worst value `optimized_metric` can take (-inf for an accuracy, +inf for a loss).

    Optuna records an infinite value as a completed, worst-possible trial, so TPE learns to avoid
    that region. NaN is not an option: hydra-optuna-sweeper (optuna 2.10) then crashes the whole
    sweep ("Values were told ... TrialState.FAIL"), so a NaN result is replaced by this value too.
    """
    value = OmegaConf.select(cfg, "sweep.failed_trial_value", default=None)
    if value is None:
        return -math.inf if higher_is_better(OmegaConf.select(cfg, "task._target_"), cfg.optimized_metric) else math.inf
    return float(value)  # a number, not NaN: CONFIG_RULES checked it before the sweep started


def searched_params() -> list[str]:
    """The keys the running Hydra sweeper searches (hydra.sweeper.params: Optuna's space, the basic sweeper's)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    params = OmegaConf.select(HydraConfig.get(), "sweeper.params", default=None)  # type: ignore[arg-type]
    return [str(key) for key in params or {}]


def check_search_space(cfg: DictConfig, searched: list[str]) -> None:
    """A search over a key this run does not read (label smoothing for a task that takes none) spends trials that
    differ by noise alone: stop at once, naming the key."""
    if not searched:
        return
    from trainkit.config.validation import unread_settings

    unread = unread_settings(cfg, searched)
    for key in searched:
        if key in unread:
            raise ConfigError(
                "hydra.sweeper.params",
                f"searches {key}, which this run does not read ({unread[key]}); remove it from the search space",
            )


def run_trial(fn: Callable[[DictConfig], Any], cfg: DictConfig, multirun: bool | None = None) -> Any:
    """Call `fn(cfg)` and return its result; in a multirun with `sweep.catch_failures` (the default),
    an exception or a NaN/None result becomes `failed_trial_value(cfg)` instead of ending the sweep.

    Never caught: ConfigError (bad input is the same for every trial: fix it, the sweep stops with
    the one-line error), KeyboardInterrupt, and a clean stop on a signal (trainkit.checkpointing.signals.Stopped,
    a SystemExit: the sweep stops with exit code 75). A non-finite loss (RunFailed) fails one trial.
    `multirun` is detected from Hydra when None (tests pass it explicitly).
    """
    if multirun is None:
        multirun = in_multirun()
    if not multirun:
        return fn(cfg)
    check_search_space(cfg, searched_params())
    catch = OmegaConf.select(cfg, "sweep.catch_failures", default=True)
    fallback = failed_trial_value(cfg)
    failed = False
    try:
        result = fn(cfg)
    except Exception as error:
        if not catch or caused_by_config_error(error):
            raise
        message = " ".join(str(error).split())[:300]
        log.error(
            f"trial failed: {type(error).__name__}: {message} -> {fallback} goes to the sweeper "
            f"(sweep.catch_failures=true){_where_traceback_goes()}"
        )
        _traceback_to_log_files(error)
        failed = True
    if failed:  # out of the except block: the traceback, and the tensors its frames held, are gone
        _release_memory()
        return fallback
    if result is None or _is_nan(result):
        log.warning(f"trial returned {result} for {cfg.optimized_metric} -> {fallback} goes to the sweeper")
        return fallback
    return result


def _is_nan(value: Any) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def _file_handlers() -> list:
    """The root logger's log files (Hydra's job log: <run dir>/<job name>.log)."""
    return [
        h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull
    ]


def _where_traceback_goes() -> str:
    files = [h.baseFilename for h in _file_handlers()]
    return f"; traceback in {files[0]}" if files else ""


def _traceback_to_log_files(error: BaseException) -> None:
    """The full traceback goes to the job's log file only; the console keeps its one line."""
    handlers = _file_handlers()
    record = log.makeRecord(
        log.name,
        logging.ERROR,
        __file__,
        0,
        "traceback of the failed trial:",
        (),
        (type(error), error, error.__traceback__),
    )
    if not handlers:
        log.handle(record)
        return
    for handler in handlers:
        if record.levelno >= handler.level:
            handler.handle(record)


def _release_memory() -> None:
    """The next trial may run in this same process: free what the failed one held on the GPU."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
