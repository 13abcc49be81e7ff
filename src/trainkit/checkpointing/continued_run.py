"""What resuming finds in a run's directory: whether the run has finished (or only its test is left), and the metrics
lines written after the checkpoint (metrics.jsonl's, the trackers' own files'), which the resumed run writes again."""

import functools
import json
from pathlib import Path

from omegaconf import DictConfig

from trainkit.tracking.loggers import trim_tracker_files


def trained_to_the_end(state: dict, cfg: DictConfig) -> str | None:
    """Why the checkpoint's run has nothing left to train under `cfg`, as stop_reason names it, or None while it has."""
    trainer, early = cfg.trainer, cfg.regularization.early_stopping
    max_steps_reached = bool(trainer.max_steps) and state["step"] >= trainer.max_steps
    if state["batches_done"] and not max_steps_reached:
        return None  # saved inside an epoch: the rest of the epoch is left
    epochs_without_improvement = (state.get("early_stopping") or {}).get("epochs_without_improvement", 0)
    if early.enabled and epochs_without_improvement >= early.patience:
        return "early_stopping"
    if max_steps_reached:
        return "max_steps"
    if state["epoch"] + 1 >= trainer.max_epochs:
        return "max_epochs"
    return None


def finished_message(state: dict, cfg: DictConfig, run_dir: Path) -> str | None:
    """One line when the checkpoint's run has nothing left to train under `cfg`, naming how to extend it."""
    if not (reason := trained_to_the_end(state, cfg)):
        return None
    trainer, patience = cfg.trainer, cfg.regularization.early_stopping.patience
    how = {
        "max_steps": f"(trainer.max_steps={trainer.max_steps} reached); resume with a higher trainer.max_steps",
        "max_epochs": f"(trainer.max_epochs={trainer.max_epochs} reached); resume with a higher trainer.max_epochs, "
        f"e.g. trainer.max_epochs={2 * trainer.max_epochs}",
        "early_stopping": f"(early stopping: no improvement for {patience} epoch{'s' if patience != 1 else ''}); "
        "resume with a higher regularization.early_stopping.patience or regularization.early_stopping.enabled=false",
    }
    return f"the run in {run_dir} has finished {how[reason]}"


def has_summary(run_dir: Path, state: dict) -> bool:
    """Whether summary.json is the checkpoint's (of its steps): a run killed in its test has none, or an earlier's."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("steps") == state["step"]
    except (OSError, json.JSONDecodeError):  # none, or torn by a kill while it was written
        return False


def finished_value(run_dir: Path) -> float | None:
    """The finished run's optimized value, from its summary.json, for a sweeper."""
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()).get("optimized_value") if summary.is_file() else None


def trim_records(state: dict, cfg: DictConfig, run_dir: Path) -> None:
    """Drop the metrics lines written after the checkpoint `state`; called once nothing is left to refuse (a refused
    resume leaves them whole)."""
    retested = trained_to_the_end(state, cfg) is not None  # only the test runs again
    trim_metrics(run_dir / "metrics.jsonl", state, retested)
    trim_tracker_files(cfg.logger, run_dir, functools.partial(written_after, state=state, retested=retested))


def trim_metrics(path: Path, state: dict, retested: bool = False) -> None:
    """Drop the metrics.jsonl lines the resume writes again: those of later steps and, after a checkpoint inside an
    epoch, that epoch's end and test lines. `retested`: only the test runs again, so its test line goes."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if not written_after(json.loads(line), state, retested)]
    if len(kept) != len(lines):
        path.write_text("".join(f"{line}\n" for line in kept))


def written_after(record: dict, state: dict, retested: bool) -> bool:
    later = record.get("step", 0) > state["step"]
    tested = any(key.startswith("test/") for key in record)
    if retested:
        return later or (tested and record.get("step") == state["step"])
    ends_the_epoch = "val/loss" in record or tested
    in_the_epoch = bool(state["batches_done"]) and record.get("epoch", -1) >= state["epoch"]
    return later or (in_the_epoch and ends_the_epoch)
