"""A multirun that resumes: rerunning the same sweep command with the same `hydra.sweep.dir` continues it.

    python train.py -m seed=1,2,3 hydra.sweep.dir=outputs/multiruns/my-sweep    # stopped half way
    python train.py -m seed=1,2,3 hydra.sweep.dir=outputs/multiruns/my-sweep    # the same again: continues

Each job of the rerun finds its own directory (<sweep dir>/<job number>) as the first run left it: with
`sweep.continue_jobs` (the default) a job whose directory holds checkpoints/last.pt resumes it as
`resume=auto` would (a finished one trains nothing and hands its summary.json value to the sweeper, an
interrupted one continues from last.pt), and a job without one starts. The plain rerun is the contract,
not `resume=auto`: a job directory that holds a run can only mean the same trial again, and starting it
afresh would mix two runs' metrics.jsonl and overwrite the first one's checkpoints.

Job numbers must mean the same trials: a rerun whose job N sets another value of a key than the run in
job N's directory trained with (another grid, an Optuna study sampling anew without its storage) is
refused in one line. Extending every trial (a higher trainer.max_epochs) is a change a resume takes.

A stopped job's "continue with:" line names this sweep command (recorded by trainkit.cli before Hydra
runs, in TRAINKIT_SWEEP_ARGV: parallel jobs run in worker processes that inherit the environment).
"""

import json
import logging
import os
import shlex
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.files import latest_checkpoint
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

SWEEP_ARGV = "TRAINKIT_SWEEP_ARGV"
# What a rerun may change in every job: how long the trials train. Anything else a job's overrides set
# differently means another trial than the one in the directory.
EXTENDING_KEYS = ("trainer.max_epochs", "trainer.max_steps", "regularization.early_stopping")


def in_multirun() -> bool:
    """True inside a job launched by `-m` / `hydra.mode=MULTIRUN` (any sweeper, any launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def continue_sweep_job(composed: DictConfig, run_dir: Path) -> None:
    """In a multirun job whose directory holds a checkpoint (a rerun of the sweep): resume it as
    resume=auto does (sets composed.resume), or refuse in one line with sweep.continue_jobs=false."""
    checkpoint = latest_checkpoint(run_dir / "checkpoints")  # last.pt, or a sharded last/
    if composed.get("resume") is not None or not in_multirun() or checkpoint is None:
        return
    if not OmegaConf.select(composed, "sweep.continue_jobs", default=True):
        raise ConfigError(
            "sweep.continue_jobs",
            f"is false but {run_dir} holds a run of an earlier sweep ({checkpoint.relative_to(run_dir)}); choose a new "
            "hydra.sweep.dir, or sweep.continue_jobs=true to continue its jobs",
        )
    log.info(f"{run_dir} holds this job's run from an earlier launch of the sweep: continuing it (resume=auto)")
    composed.resume = "auto"


def refuse_another_trial(changes: list[str], overrides: list[str], run_dir: Path) -> None:
    """In a multirun: a key this job's overrides set that changed since the checkpoint (other than how
    long to train) means job N is another trial now; one line, before anything is trained or returned."""
    set_here = [o.split("=", 1)[0].lstrip("+~").replace("/", ".") for o in overrides if "=" in o]
    set_here = [key for key in set_here if not key.startswith("hydra") and key != "resume"]
    for change in changes:
        key = change.split(" ", 1)[0]
        chosen = any(key == s or key.startswith(f"{s}.") for s in set_here)
        if chosen and not any(key == e or key.startswith(f"{e}.") for e in EXTENDING_KEYS):
            raise ConfigError(
                "hydra.sweep.dir",
                f"{run_dir} holds a trial with other settings than this sweep's job there ({change}): the "
                "sweep's parameters changed; rerun it as it was to continue it, or choose a new hydra.sweep.dir",
            )


def remember_sweep_command(argv: list[str], multirun: bool) -> None:
    """Before Hydra, in the process that launches a multirun: its command line, for the jobs' stop lines."""
    if multirun:
        os.environ[SWEEP_ARGV] = json.dumps(argv)


def sweep_rerun_command() -> str | None:
    """In a multirun (a job, or the process that launched it): the sweep's own command with its sweep
    directory, shell-quoted: what continues the whole sweep. None when no sweep command was recorded,
    or its directory is not known here (the launching process of a sweep into a time-named directory)."""
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
