"""Resume continues a run: in its own directory, with the checkpoint's config.

    python train.py resume=outputs/runs/<run>                        # or .../checkpoints/last.pt
    python train.py resume=outputs/runs/<run> trainer.max_epochs=40  # overrides on top, each one listed
    python train.py resume=auto hydra.run.dir=outputs/runs/job-42    # requeued jobs: continue, or start

Hydra makes the run directory from the command line before main runs, so `rewrite_argv` (before Hydra) checks the
checkpoint and puts its run directory and overrides on the command line; `resumed_config` (in main) takes the keys this
command sets into the checkpoint's config. Under torchrun every rank does both alike."""

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from trainkit.checkpointing.checkpoint import remove_stale_temporary_files
from trainkit.checkpointing.continued_run import finished_message, has_summary
from trainkit.checkpointing.files import (
    check_model_fits,
    check_output_dir,
    find_checkpoint,
    latest_checkpoint,
    read_checkpoint,
)
from trainkit.checkpointing.overrides import config_with_overrides, flatten, hydra_quote
from trainkit.config.filled_in import as_set
from trainkit.distributed.process_group import any_rank, launched_externally, process_info
from trainkit.errors import ConfigError
from trainkit.models.build import build_model

log = logging.getLogger(__name__)

AUTO = "auto"
# Keys besides data.* that make an epoch's batches, named by refuse_another_epoch_plan (which compares the batches).
EPOCH_PLAN_KEYS = ("seed", "trainer.limit_train_batches", "trainer.accumulate_grad_batches")
# What a rerun sweep with resume=auto may change in a job (how long it trains); anything else: refuse_another_trial.
EXTENDING_KEYS = ("trainer.max_epochs", "trainer.max_steps", "regularization.early_stopping")
INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")


def _value(argv: list[str], key: str) -> str | None:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{key}=")]
    return values[-1].strip("'\"") if values else None


_PLAIN = re.compile(r"[\w/.:@%+~-]*", re.ASCII)  # a value Hydra reads unquoted as this one string


def _quoted_if_a_path(arg: str) -> str:
    """`key=value`, quoted for Hydra where the value is an existing path Hydra would misread (commas, '=', spaces,
    non-ASCII letters). resume= is quoted in rewrite_argv."""
    key, sep, value = arg.partition("=")
    if not sep or arg.startswith("-") or key == "resume" or value[:1] in ("'", '"') or _PLAIN.fullmatch(value):
        return arg
    try:
        exists = Path(value).expanduser().exists()
    except (OSError, ValueError):  # not a path (too long, a NUL): Hydra reads it as it is
        return arg
    return f"{key}={hydra_quote(value)}" if exists else arg


def run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory holding `checkpoint` (<run>/checkpoints/<file> next to <run>/.hydra), if any."""
    folder = checkpoint.resolve().parent
    return folder.parent if folder.name == "checkpoints" and (folder.parent / ".hydra").is_dir() else None


def is_multirun(argv: list[str]) -> bool:
    """Whether this command line starts a multirun (-m, or a search config, which sets hydra.mode)."""
    return any(arg in ("-m", "--multirun") for arg in argv) or _value(argv[1:], "hparams_search") is not None


def in_multirun() -> bool:
    """True inside a job launched by `-m` / `hydra.mode=MULTIRUN` (any sweeper, any launcher)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def rewrite_argv(argv: list[str], resumes: bool = True) -> list[str]:
    """Before Hydra: the command line that resumes in the checkpoint's run directory; ConfigError where the checkpoint
    or the output directory is unusable. `resumes=False`: the script continues no run, and resume= is refused."""
    argv = [argv[0], *map(_quoted_if_a_path, argv[1:])]
    overrides = [arg for arg in argv[1:] if not arg.startswith("-") and ("=" in arg or arg.startswith("~"))]
    if any(arg in INFO_FLAGS for arg in argv):  # --help, --cfg job, ...: nothing is trained or written
        return argv
    resume = _value(overrides, "resume")
    multirun = is_multirun(argv)
    if not resumes and resume not in (None, "", "null", "None"):
        raise ConfigError("resume", f"{Path(argv[0]).name} continues no run; drop resume= (train.py resume= does)")
    if resume in (None, "", "null", "None", AUTO):
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        check_output_dir(_value(overrides, key), key)
        return argv
    given_path = Path(resume).expanduser()
    if multirun or ("," in resume and not given_path.exists()):  # a path may hold commas (override_dirname's)
        raise ConfigError(
            "resume",
            "continues one run and cannot be part of a multirun (-m); resume each run directory on its own, "
            "or give the sweep resume=auto (each job continues its own directory)",
        )
    checkpoint = find_checkpoint(resume)
    refuse_weights_only(checkpoint, read_checkpoint(checkpoint, mmap=True))  # readable, a training checkpoint, ...
    run_dir, given = run_dir_of(checkpoint), _value(overrides, "hydra.run.dir")
    # Paths go to Hydra quoted; resume= comes first of this command's own overrides (own_overrides finds them by it).
    own = [f"resume={hydra_quote(str(given_path))}", *(arg for arg in argv[1:] if not arg.startswith("resume="))]
    if run_dir is None:  # a checkpoint outside a run directory: a new run directory continues it
        check_output_dir(given)
        return [argv[0], *own]
    if given is not None and Path(given).resolve() != run_dir:
        raise ConfigError(
            "hydra.run.dir",
            f"is {given}, but resume= continues in the checkpoint's own run directory {run_dir}; drop "
            f"hydra.run.dir (to branch off, copy the run directory and resume the copy)",
        )
    check_output_dir(str(run_dir))
    saved = run_dir / ".hydra" / "overrides.yaml"
    replayed = [str(o) for o in OmegaConf.load(saved)] if saved.is_file() else []
    replayed = [o for o in replayed if not o.startswith(("resume=", "hydra.run.dir="))]
    # Hydra writes no .hydra/ now (a refused override would land in overrides.yaml); resumed_config does, once resolved.
    return [argv[0], f"hydra.run.dir={hydra_quote(str(run_dir))}", "hydra.output_subdir=null", *replayed, *own]


def own_overrides(overrides: list[str]) -> list[str]:
    """This command's own overrides among Hydra's task overrides: from its resume= on (see rewrite_argv)."""
    starts = [i for i, override in enumerate(overrides) if override.startswith("resume=")]
    return overrides[starts[-1] :] if starts else overrides


def resumed_config(composed: DictConfig, run_dir: Path, overrides: list[str] | None = None) -> tuple[DictConfig, bool]:
    """The config to train with, and whether the run has finished already (one line says how to extend it). Without
    resume: `composed` as it is. `overrides`: those `composed` was made with (Hydra's task overrides by default)."""
    if composed.resume is None:  # a sweep's job too: its directory holds another run where a sweep is rerun
        refuse_a_new_run_over_another(run_dir)
    if not isinstance(composed.resume, str) or composed.resume == "":
        return composed, False  # null, or a wrong type that trainkit.config.validation reports
    explicit = composed.resume != AUTO
    checkpoint = find_checkpoint(composed.resume) if explicit else latest_checkpoint(run_dir / "checkpoints")
    main = process_info().is_main  # under torchrun every rank resolves; one of them writes
    if checkpoint is None:  # resume=auto, and neither last.pt nor a sharded last/: a new run
        torn = remove_stale_temporary_files(run_dir / "checkpoints") if main else []
        removed = f" (removed the torn {', '.join(torn)})" if torn else ""
        message = f"resume=auto: no checkpoint in {run_dir}: starting a new run{removed}"
        if (unfixed := unfixed_directory()) is None:
            log.info(message)
        elif main:  # a rerun would never continue it
            log.warning(
                f"{message}; {unfixed} is named after the launch time, so a rerun gets a new directory and "
                f"never continues this one: set {unfixed}=<a fixed directory> (e.g. outputs/runs/job-42)"
            )
        composed.resume = None
        return composed, False
    state = read_checkpoint(checkpoint, mmap=True)
    refuse_weights_only(checkpoint, state)
    overrides = _hydra_task_overrides() if overrides is None else overrides
    if explicit:  # resume=<path>: the keys typed on this command change the run; resume=auto: every override
        overrides = own_overrides(overrides)
    resolved = config_with_overrides(state["config"], composed, overrides, explicit)
    resolved.resume = str(checkpoint)
    changes = _changes(state["config"], OmegaConf.to_container(resolved, resolve=True))
    _refuse_another_optimizer(state, resolved)
    if not explicit and in_multirun():  # a rerun sweep: job N must be the same trial as before
        refuse_another_trial(changes, overrides, run_dir)
    _refuse_another_checkpoint_layout(checkpoint, state, resolved)
    new_model = any(change.startswith(("model.", "data.channels ", "data.num_classes ")) for change in changes)
    if new_model and "model" in state:  # a sharded checkpoint's weights are checked as they load
        _check_model_fits_early(state["model"], resolved)
    position = f"epoch {state['epoch']}" + (f", batch {state['batches_done']}" if state["batches_done"] else " (done)")
    listed = "; changed: " + ", ".join(changes) if changes else "; config as in the checkpoint"
    if main:
        log.info(f"resuming {checkpoint} at {position}, step {state['step']}{listed}")
    finished = finished_message(state, resolved, run_dir)
    if finished and not has_summary(run_dir, state):  # finished once summary.json is written: train.py only tests
        finished = None
        if main:
            log.info(
                f"the run in {run_dir} trained to its end but has no summary.json (stopped during its test): "
                "testing it now"
            )
    if not finished and (world_size := _planned_world_size(resolved)) is not None:  # before any worker starts
        refuse_another_world_size_inside_an_epoch(state, world_size)
    if finished or not main:
        if finished and main:
            log.info(finished)
        return resolved, bool(finished)
    if stale := remove_stale_temporary_files(checkpoint.parent):
        log.info(f"removed {', '.join(stale)} from {checkpoint.parent}: torn by an earlier kill during a save")
    if (run_dir / ".hydra").is_dir():  # the config as set (what the run fills in: record_filled_in), its overrides
        _save_atomically(as_set(resolved, composed, run_dir), run_dir / ".hydra" / "config.yaml")
        _save_atomically(OmegaConf.create(_hydra_task_overrides()), run_dir / ".hydra" / "overrides.yaml")
    return resolved, False


def refuse_another_trial(changes: list[str], overrides: list[str], run_dir: Path) -> None:
    """Refuse resume=auto in a multirun where a key the job sets changed, beyond how long to train: another trial."""
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


def refuse_a_new_run_over_another(run_dir: Path) -> None:
    """Refuse a new run (no resume=) in a directory holding a run's checkpoint, metrics lines or summary.json, naming
    resume= and another directory instead. Only Hydra's record and a log: nothing to lose, the new run starts there."""
    checkpoints = run_dir / "checkpoints"
    resumable = latest_checkpoint(checkpoints)
    checkpoint = resumable or min(checkpoints.glob("*.pt"), default=None)
    metrics = run_dir / "metrics.jsonl"
    held = [str(checkpoint.relative_to(run_dir))] if checkpoint else []
    held += ["metrics.jsonl"] if metrics.is_file() and metrics.stat().st_size else []
    held += ["summary.json"] if (run_dir / "summary.json").is_file() else []
    if not held:
        return
    other = next(f"{run_dir}-{n}" for n in range(2, 10_000) if not Path(f"{run_dir}-{n}").exists())
    elsewhere = f"elsewhere (e.g. hydra.run.dir={other})"
    way_out = f"continue it with resume={run_dir}, or start a new run {elsewhere}"
    if resumable is None:
        way_out = f"it has no checkpoints/last.pt to resume from: start the new run {elsewhere}"
    raise ConfigError(
        "hydra.run.dir",
        f"{run_dir} holds a run ({', '.join(held)}), and a new run there would overwrite its checkpoints and "
        f"append to its metrics.jsonl; {way_out}",
    )


def _save_atomically(config: Any, path: Path) -> None:
    """Under torchrun the other ranks may be reading overrides.yaml (rewrite_argv) right now."""
    tmp = path.with_name(path.name + ".tmp")
    OmegaConf.save(config, tmp)
    os.replace(tmp, path)


def unfixed_directory(hydra: Any = None) -> str | None:
    """The key (hydra.run.dir or hydra.sweep.dir) whose directory interpolates the launch time, so resume=auto could
    never continue it; else None (always in a submitit job: its requeue keeps the directory)."""
    hydra = hydra or (HydraConfig.get() if HydraConfig.initialized() else None)
    if hydra is None or os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    key = "sweep" if hydra.get("mode") == RunMode.MULTIRUN else "run"
    section = OmegaConf.to_container(hydra[key], resolve=False)  # the pattern, not today's name
    value = section.get("dir") if isinstance(section, dict) else None
    return f"hydra.{key}.dir" if re.search(r"\$\{(launch_time|now):", str(value)) else None


def _hydra_task_overrides() -> list[str]:
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _changes(saved: Any, resolved: Any) -> list[str]:
    before, after = flatten(saved), flatten(resolved)
    keys = [key for key in after if key != "resume" and before.get(key, KeyError) != after[key]]
    # data.num_classes: null (count the classes) is no change from the checkpoint's count; check_same_data checks it.
    if after.get("data.num_classes", 0) is None:
        keys = [key for key in keys if not (key.endswith(".num_classes") and after[key] is None)]
    keys += [key for key in before if key not in after]
    return [f"{key} {before.get(key, '(new)')} -> {after.get(key, '(dropped)')}" for key in keys]


def _refuse_another_optimizer(state: dict, resolved: DictConfig) -> None:
    saved = state["config"].get("optimizer", {}).get("_target_")
    if saved != resolved.optimizer.get("_target_"):
        raise ConfigError(
            "optimizer",
            f"is {resolved.optimizer.get('_target_')} but the checkpoint's optimizer state is {saved}'s; "
            "resume with the checkpoint's optimizer",
        )


def _refuse_another_checkpoint_layout(checkpoint: Path, state: dict, resolved: DictConfig) -> None:
    """A sharding strategy writes checkpoints/last/, the others last.pt; neither loads the other's optimizer state."""
    from trainkit.distributed.parallel import strategy

    sharded = strategy(resolved.distributed.get("parallel")).last.endswith("/")
    if checkpoint.is_dir() != sharded:
        wrote = state["config"].get("distributed", {}).get("name")
        raise ConfigError(
            "distributed",
            f"is {resolved.distributed.name}, but distributed={wrote} wrote {checkpoint} "
            f"({'a folder of shards' if checkpoint.is_dir() else 'one file'}); resume with the distributed setting "
            f"that wrote it, or start a new run with the one you want",
        )


def refuse_weights_only(checkpoint: Path, state: dict) -> None:
    """Refuse a sharded run's best.pt: full weights without optimizer state, for eval.py and fine-tuning only."""
    optimizer = state.get("optimizer")  # (a sharded checkpoint's state.pt holds none: its shards do)
    if isinstance(optimizer, dict) and optimizer.get("param_groups") == []:
        raise ConfigError(
            "resume",
            f"{checkpoint} holds weights without optimizer state (a sharded run's best.pt), so it cannot be "
            f"resumed; resume the run directory (its checkpoints/last/), or evaluate the file with "
            f"python eval.py checkpoint={checkpoint}",
        )


def _planned_world_size(cfg: DictConfig) -> int | None:
    """How many processes will train; None where the launch refuses the run (several processes none started)."""
    if launched_externally() or cfg.distributed.name == "none":
        return process_info().world_size  # 1 unless torchrun or SLURM started the processes
    planned: int | None = None  # several processes that none started: start_processes refuses the run
    from trainkit.distributed.local_launch import planned_workers  # feature: local_launch

    planned = planned_workers(cfg)  # feature: local_launch
    return planned


def refuse_another_world_size_inside_an_epoch(state: dict, world_size: int) -> None:
    """Inside an epoch, a checkpoint counts its batches in its number of processes' shards (one RNG snapshot each):
    with another number, "batch 5" is another place in the data. `world_size`: the processes there are or will be."""
    saved = len(state.get("rng") or [world_size])  # (a checkpoint without RNG streams cannot tell)
    if state["batches_done"] and saved != world_size:
        now, then = (f"{count} process{'es' if count != 1 else ''}" for count in (world_size, saved))
        raise ConfigError(
            "distributed.nproc_per_node",
            f"this run has {now} but {then} wrote its checkpoint inside epoch {state['epoch']} (after batch "
            f"{state['batches_done']}): the batches already trained would be miscounted; resume with {then}, or from "
            "an epoch's end",
        )


def epoch_plan(batches: list[list[int]], num_batches: int, accumulate: int) -> dict:
    """What an epoch trains on this rank: a digest of its first `num_batches` batches' samples, their count, and
    `accumulate` batches per update. A checkpoint written inside an epoch keeps every rank's."""
    kept = batches[:num_batches]
    digest = hashlib.sha256(json.dumps(kept).encode()).hexdigest()
    return {"digest": digest, "batches": len(kept), "accumulate": accumulate}


def refuse_another_epoch_plan(state: dict, plan: dict, config: dict, rank: int, device: Any) -> None:
    """A resume inside an epoch skips the batches trained, only right for the same batches in the same updates: `plan`
    (this run's epoch_plan) must be the checkpoint's, else every rank raises one line naming `config`'s changed keys."""
    saved = state.get("epoch_plan") or []  # none at an epoch's end (and in checkpoints from before plans)
    if not state["batches_done"] or rank >= len(saved) or not any_rank(saved[rank] != plan, device):
        return
    split = [change.split(" ", 1) for change in _changes(state["config"], config)]
    changes = [(key, values) for key, values in split if key.startswith("data.") or key in EPOCH_PLAN_KEYS]
    keys = ", ".join(key for key, _ in changes) or "data"
    what = ", ".join(values for _, values in changes) or "its files changed since the checkpoint (other lengths)"
    epoch, done, before = state["epoch"], state["batches_done"], saved[rank]
    if before["digest"] != plan["digest"]:
        count = before["batches"] != plan["batches"]
        other = f"{plan['batches']} batches, not {before['batches']}" if count else "as many, of other samples"
        why = f"hold other batches ({other}): skipping the {done} trained would train some samples twice, others never"
    else:
        grouped = f"{plan['accumulate']} batches to an update, not {before['accumulate']}"
        why = f"group {grouped}: the updates trained would be miscounted"
    raise ConfigError(
        keys,
        f"{what} on a resume inside epoch {epoch} (after batch {done} of {before['batches']}): the epoch would {why}; "
        f"at an epoch's end it is taken: resume without it until epoch {epoch} ends (trainer.max_epochs={epoch + 1}), "
        f"then with it, or resume from a checkpoint of an epoch's end (checkpoints/best.pt, if a whole epoch wrote it)",
    )


def _check_model_fits_early(weights: dict, cfg: DictConfig) -> None:
    """Check the new model, built on the meta device, against the checkpoint's weights (or at load, if it cannot be)."""
    try:
        with torch.device("meta"):
            model = build_model(cfg.model)
    except Exception:  # a model that cannot be built on the meta device: train.py's load-time check still applies
        return
    check_model_fits(weights, model)
