"""A multirun that resumes: rerunning the same sweep command with the same `hydra.sweep.dir` continues it.

    python train.py -m seed=1,2,3 hydra.sweep.dir=outputs/multiruns/my-sweep    # stopped half way
    python train.py -m seed=1,2,3 hydra.sweep.dir=outputs/multiruns/my-sweep    # the same again: continues

With `sweep.continue_jobs` (the default) a job whose directory holds checkpoints/last.pt resumes it as `resume=auto`
would (a finished one hands its summary.json value to the sweeper), and a job without one starts. A job N that sets
another value than the run in its directory trained with is refused (refuse_another_trial); a longer training is taken.

A stopped job's "continue with:" line names this sweep command (recorded by `remember_sweep_command`, passed on in
CONTINUE_WITH_ENV). Without this module a rerun into the same hydra.sweep.dir is refused in one line.
"""

import json
import logging
import os
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.files import latest_checkpoint
from trainkit.checkpointing.resume import in_multirun, is_multirun
from trainkit.checkpointing.signals import CONTINUE_WITH_ENV
from trainkit.config.schema import flag
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

SWEEP_ARGV = "TRAINKIT_SWEEP_ARGV"
CONFIG_RULES = {"sweep.continue_jobs": flag()}  # gathered by the config check: conf/config.yaml's sweep._checks_


def continue_sweep_job(composed: DictConfig, run_dir: Path) -> None:
    """In a multirun job: name the sweep's rerun for its stop lines; where its directory holds a checkpoint (a
    rerun of the sweep), resume it as resume=auto does (sets composed.resume), or refuse in one line with
    sweep.continue_jobs=false."""
    if not in_multirun():
        return
    _name_the_rerun()
    checkpoint = latest_checkpoint(run_dir / "checkpoints")  # last.pt, or a sharded last/
    if composed.get("resume") is not None or checkpoint is None:
        return
    if not OmegaConf.select(composed, "sweep.continue_jobs", default=True):
        raise ConfigError(
            "sweep.continue_jobs",
            f"is false but {run_dir} holds a run of an earlier sweep ({checkpoint.relative_to(run_dir)}); choose a new "
            "hydra.sweep.dir, or sweep.continue_jobs=true to continue its jobs",
        )
    log.info(f"{run_dir} holds this job's run from an earlier launch of the sweep: continuing it (resume=auto)")
    composed.resume = "auto"


def remember_sweep_command(argv: list[str]) -> None:
    """Before Hydra, in the process that launches a multirun: its command line, for the jobs' stop lines."""
    if is_multirun(argv):
        os.environ[SWEEP_ARGV] = json.dumps(argv)
        _name_the_rerun()


def _name_the_rerun() -> None:
    if command := sweep_rerun_command():
        os.environ[CONTINUE_WITH_ENV] = command


def sweep_rerun_command() -> str | None:
    """In a multirun: the sweep's own command with its sweep directory, shell-quoted; None where either is unknown."""
    from hydra.core.hydra_config import HydraConfig

    argv = json.loads(os.environ.get(SWEEP_ARGV, "null") or "null")
    given = [arg.split("=", 1)[1] for arg in argv or [] if arg.startswith("hydra.sweep.dir=")]
    if argv and in_multirun():
        sweep_dir = HydraConfig.get().sweep.dir
    elif given:
        sweep_dir = given[-1]
    else:
        return None
    kept = [arg for arg in argv[1:] if not arg.startswith("hydra.sweep.dir=")]
    return shlex.join(["python", Path(argv[0]).name, *kept, f"hydra.sweep.dir={Path(sweep_dir).resolve()}"])
